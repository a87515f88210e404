"""The ``e2e`` marker: tests that drive the real nnU-Net commands (minutes on a CPU)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end test through the real nnU-Net command line (slow)")
