"""Self-supervised pretraining on a dataset's own images (``nnUNetv2_meddisseg_pretrain``)."""
