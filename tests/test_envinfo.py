"""What the manifest records of the environment."""


def test_torch_build_info_without_import_matches_torch():
    """The manifest's torch version is read from torch/version.py; it must be what torch says."""
    import subprocess
    import sys

    from patchbench.envinfo import torch_build_info
    got = torch_build_info()
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert [got["torch"], str(got["cuda_build"])] == out
