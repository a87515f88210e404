"""Where nnU-Net finds our trainers: ``export nnUNet_extTrainer=$(python -m nnunetv2_meddisseg.trainer_path)``.

nnU-Net (>= 2.8.0) searches the folders listed in the environment variable ``nnUNet_extTrainer``
for trainer classes it does not ship itself; this prints the one folder of this package meant for
that (``nnunetv2_meddisseg/nnunet_trainers``).
"""
from pathlib import Path

__all__ = ["TRAINER_FOLDER", "trainer_folder", "main"]

TRAINER_FOLDER = Path(__file__).resolve().parent / "nnunet_trainers"


def trainer_folder() -> str:
    """Absolute path of the folder to put into ``nnUNet_extTrainer``."""
    return str(TRAINER_FOLDER)


def main() -> None:
    print(trainer_folder())


if __name__ == "__main__":
    main()
