"""Self-supervised pretraining on a dataset's own images (``nnUNetv2_meddisseg_pretrain``): Models Genesis
restoration (``restoration``) and the command that runs it on nnU-Net's preprocessed data (``pretrain``)."""
