from setuptools import find_packages, setup

setup(
    name="nnunetv2_meddisseg",
    version="0.1.0",
    description="Med-DisSeg (dispersion-regularised, attention-guided segmentation) as an nnU-Net v2 plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["nnunetv2_meddisseg", "nnunetv2_meddisseg.*"]),
    package_data={"nnunetv2_meddisseg": ["datasets/splits/*.json", "evaluation/paper_results.json"]},
    install_requires=[
        "nnunetv2>=2.8.0,<2.9",
        "torch",  # whatever version nnunetv2 resolves
        "dynamic-network-architectures",
        "batchgeneratorsv2",
        "SimpleITK",
        "numpy",
        "scipy",
        "matplotlib",
        "pillow",
        "pydantic>=2",
        "tqdm",
    ],
    extras_require={"test": ["pytest", "pytest-xdist", "h5py", "onnx", "onnxruntime", "openvino", "nncf",
                             "litserve>=0.2.19,<0.3"],
                    "synapse": ["h5py"], "onnx": ["onnx", "onnxruntime"], "openvino": ["openvino", "nncf"],
                    # the server's engine (FastAPI / uvicorn underneath); without PyTorch
                    "serve": ["litserve>=0.2.19,<0.3"]},
    entry_points={
        "console_scripts": [
            "nnUNetv2_meddisseg_plan=nnunetv2_meddisseg.planning.plan_meddisseg:main",
            "nnUNetv2_meddisseg_convert=nnunetv2_meddisseg.datasets.convert:main",
            "nnUNetv2_meddisseg_evaluate=nnunetv2_meddisseg.evaluation.evaluate:main",
            "nnUNetv2_meddisseg_compare=nnunetv2_meddisseg.evaluation.compare_models:main",
            "nnUNetv2_meddisseg_demo=nnunetv2_meddisseg.demo:main",
            "nnUNetv2_meddisseg_ablate=nnunetv2_meddisseg.ablation.ablate:main",
            "nnUNetv2_meddisseg_features=nnunetv2_meddisseg.evaluation.feature_space:main",
            "nnUNetv2_meddisseg_weights_only=nnunetv2_meddisseg.sharing:main",
            "nnUNetv2_meddisseg_export=nnunetv2_meddisseg.deploy.export:main",
            "nnUNetv2_meddisseg_predict_onnx=nnunetv2_meddisseg.deploy.predict_onnx:main",
            "nnUNetv2_meddisseg_pretrain=nnunetv2_meddisseg.pretraining.pretrain:main",
            "nnUNetv2_meddisseg_serve=nnunetv2_meddisseg.deploy.serve:main",
        ]
    },
)
