"""Every Triton kernel of the package builds for a Hopper GPU (sm_90) here, without a GPU: Triton's compiler
runs on the CPU down to machine code. Triton's interpreter (the other kernel tests) runs the kernels'
Python and misses what only the compiler rejects (e.g. a ``tl.constexpr`` assigned again in an unrolled
loop)."""
import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (PyTorch's CUDA build ships it)")

from nnunetv2_meddisseg.blocks import cdfa_kernels, telu_kernels  # noqa: E402


def _build(kernel, pointer_types, constexprs, target):
    from triton.compiler import ASTSource

    names = kernel.arg_names
    signature = {}
    for name in names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointer_types.get(name, "*fp32")
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=target)


def _target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


CDFA_CASES = [
    ("offset_weights_fwd", 0, dict(HEADS=4, K=3, BLOCK_P=64, BLOCK_D=32)),
    ("offset_weights_bwd", 1, dict(HEADS=4, K=3, BLOCK_P=64, BLOCK_J=16)),
    ("aggregate", 2, dict(HEADS=4, S=5, TRANSPOSED=False, BLOCK_P=64, BLOCK_C=32)),
    ("aggregate_transposed", 2, dict(HEADS=4, S=5, TRANSPOSED=True, BLOCK_P=64, BLOCK_C=32)),
    ("aggregate_grad_d", 3, dict(HEADS=4, S=5, BLOCK_P=64, BLOCK_C=32, ONE_BLOCK=True)),
    ("aggregate_grad_d_blocks", 3, dict(HEADS=4, S=5, BLOCK_P=64, BLOCK_C=32, ONE_BLOCK=False)),
]


@pytest.mark.parametrize("name, index, constexprs", CDFA_CASES, ids=[c[0] for c in CDFA_CASES])
def test_cdfa_kernels_build_for_sm90(name, index, constexprs, dtype="*bf16"):
    kernel = cdfa_kernels._kernels()[index]
    # activations (logits, values, upstream gradients) in the autocast dtype, offset weights in fp32
    types = {n: dtype for n in ("logits_ptr", "gl_ptr", "v_ptr", "out_ptr", "g_ptr")}
    compiled = _build(kernel, types, constexprs, _target(90))
    assert compiled.asm.get("ptx") and ".target sm_90" in compiled.asm["ptx"]


@pytest.mark.parametrize("with_slope", [False, True])
def test_telu_kernel_builds_for_sm90(with_slope, dtype="*bf16"):
    types = {"x_ptr": dtype, "y_ptr": dtype, "slope_ptr": dtype}
    compiled = _build(telu_kernels._telu_kernel, types, dict(WITH_SLOPE=with_slope, CLAMP=4.0, BLOCK=1024), _target(90))
    assert ".target sm_90" in compiled.asm["ptx"]
