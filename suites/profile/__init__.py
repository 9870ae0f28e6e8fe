"""Profile suite (being built): host syncs per decode step and GPU idle gaps from the live server."""
