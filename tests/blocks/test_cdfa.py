import pytest
import torch
from merged_check import assert_merged_equals_previous, build, randomised
from reference_impls import (
    PreviousContrastGuidancePyramid,
    reference_cdfa_forward,
    reference_window_attention,
    reference_window_weights,
)
from torch import nn

from nnunetv2_meddisseg.blocks import cdfa, device_forms
from nnunetv2_meddisseg.blocks.cdfa import (
    ContrastDrivenAggregation,
    ContrastGuidancePyramid,
    PointwiseLinear,
    displacement_sum,
    window_displacement_weights,
)
from nnunetv2_meddisseg.blocks.device_forms import (
    form_blocks,
    implementation_form_of,
    set_implementation_form,
)


def _linear(layer, x):
    # x: (..., C_in)
    return x @ layer.weight.flatten(1).T + layer.bias


def _brute_force_window(m: ContrastDrivenAggregation, values, guidance, layer):
    """Per-pixel loop: every window writes A[h, i, j] * v(p + off_j) to pixel p + off_i."""
    b_, c, h, w = values.shape
    k, r = m.kernel_size, m.kernel_size // 2
    win, nh, hd = k * k, m.num_heads, c // m.num_heads
    out = torch.zeros_like(values)
    for b in range(b_):
        for y in range(h):
            for x in range(w):
                logits = _linear(layer, guidance[b, :, y, x]).reshape(nh, win, win) * m.scale
                a = torch.softmax(logits, dim=-1)
                for i in range(win):
                    oy, ox = y + i // k - r, x + i % k - r
                    if not (0 <= oy < h and 0 <= ox < w):
                        continue
                    for j in range(win):
                        sy, sx = y + j // k - r, x + j % k - r
                        if not (0 <= sy < h and 0 <= sx < w):
                            continue  # zero padding
                        out[b, :, oy, ox] += a[:, i, j].repeat_interleave(hd) * values[b, :, sy, sx]
    return _linear(m.proj, out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _brute_force_cdfa(m, x, fg, bg):
    x = m.input_convs(x)
    v = _linear(m.value, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    y = _brute_force_window(m, v, fg, m.attn_fg)
    y = _brute_force_window(m, y, bg, m.attn_bg)
    return m.output_convs(y)


def _in_form(form):
    """The block's forward in one implementation form ("shifted": shifted views, "graph": padded copies, no
    in-place writes)."""
    def forward(m, x, fg, bg):
        with implementation_form_of(m, form):
            return m(x, fg, bg)
    return forward


IMPLEMENTATIONS = {"current": _in_form("shifted"), "graph": _in_form("graph"), "first": reference_cdfa_forward}
FORMS = ("shifted", "graph")


@pytest.mark.parametrize(
    "implementation,in_channels,dim,heads,size,kernel",
    [(impl, *case) for impl in sorted(IMPLEMENTATIONS) for case in [(256, 128, 4, (4, 4), 3), (8, 16, 2, (3, 5), 3)]]
    + [(impl, 8, 16, 2, (4, 6), 5) for impl in ("current", "graph")],
)
def test_matches_brute_force(implementation, in_channels, dim, heads, size, kernel):
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(in_channels, dim, heads, kernel_size=kernel).double().eval()
    with torch.no_grad():
        # sharpen the generated attention so that a wrong window index would show
        for layer in (m.attn_fg, m.attn_bg):
            layer.weight.mul_(20)
        x = torch.randn(2, in_channels, *size, dtype=torch.float64)
        fg = torch.randn(2, dim, *size, dtype=torch.float64)
        bg = torch.randn(2, dim, *size, dtype=torch.float64)
        ours = IMPLEMENTATIONS[implementation](m, x, fg, bg)
        ref = _brute_force_cdfa(m, x, fg, bg)
    assert ours.shape == (2, dim, *size)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_fg_and_bg_guidance_both_matter():
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 16, 4).eval()
    x, fg, bg = torch.randn(1, 16, 6, 6), torch.randn(1, 16, 6, 6), torch.randn(1, 16, 6, 6)
    with torch.no_grad():
        y = m(x, fg, bg)
        assert not torch.allclose(y, m(x, torch.randn_like(fg), bg))
        assert not torch.allclose(y, m(x, fg, torch.randn_like(bg)))


def test_reference_parameter_count():
    # CDFA4 (128 in) + three CDFAs with 256 in: 3.272 M in the reference
    total = sum(p.numel() for p in ContrastDrivenAggregation(128).parameters())
    total += 3 * sum(p.numel() for p in ContrastDrivenAggregation(256).parameters())
    assert total == 3_272_224


def test_invalid_arguments():
    with pytest.raises(ValueError, match="divisible"):
        ContrastDrivenAggregation(16, 18, 4)
    with pytest.raises(ValueError, match="odd"):
        ContrastDrivenAggregation(16, 16, 4, kernel_size=2)


def test_guidance_pyramid_shapes():
    pyr = ContrastGuidancePyramid(16, 16, (3, 2, 1, 0))
    f_fg, f_bg = torch.randn(2, 16, 2, 3), torch.randn(2, 16, 2, 3)
    out = pyr(f_fg, f_bg)
    assert [tuple(fg.shape) for fg, _ in out] == [(2, 16, 16, 24), (2, 16, 8, 12), (2, 16, 4, 6), (2, 16, 2, 3)]
    assert all(fg.shape == bg.shape for fg, bg in out)
    assert [len(lv) for lv in pyr.step_levels] == [3, 2, 1]
    # the reference's CDFA pre-processing: 20 Conv3x3-BN-act blocks of 128 channels = 2.954 M
    assert sum(p.numel() for p in ContrastGuidancePyramid(128, 128).parameters()) == 20 * (128 * 128 * 9 + 256)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("num_upsamplings", [(3, 2, 1, 0), (0, 2, 1), (1, 1)])
def test_guidance_pyramid_equals_separate_branches(training, num_upsamplings):
    """The merged pyramid against the separate branches it replaces (their weights merged into it)."""
    torch.manual_seed(0)
    old = randomised(build(PreviousContrastGuidancePyramid, 8, 4, num_upsamplings)).train(training)
    new = ContrastGuidancePyramid(8, 4, num_upsamplings)
    f = [torch.randn(2, 8, 3, 5), torch.randn(2, 8, 3, 5)]
    assert_merged_equals_previous(old, new, f)
    assert all(k.startswith(("stem.", "up_convs.")) for k in new.state_dict())  # merged keys only


def test_pointwise_linear_equals_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(6, 5)
    pointwise = PointwiseLinear(6, 5)
    pointwise.load_state_dict({"weight": linear.weight.view(5, 6, 1, 1), "bias": linear.bias})
    x = torch.randn(2, 6, 3, 4)
    torch.testing.assert_close(pointwise(x), linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
    # nn.Linear's initialisation: uniform within 1/sqrt(fan_in), weight and bias
    big = PointwiseLinear(64, 512)
    bound = 64 ** -0.5
    assert big.weight.abs().max() <= bound and big.weight.abs().max() > 0.9 * bound
    assert big.bias.abs().max() <= bound and big.bias.abs().max() > 0.9 * bound


def test_guidance_pyramid_grouped_init_matches_separate_fan_in():
    """kaiming initialisation of each group of a grouped conv uses that group's fan-in, as separate convs did."""
    conv = ContrastGuidancePyramid(64, 32, (1, 0)).up_convs[0].conv
    assert conv.weight.shape[1] * 9 == 32 * 9  # per-group input channels


# --- the current window attention (shifted views) against the first implementation (unfold / matmul / fold)

def _module_and_inputs(size, in_channels=32, dim=32, heads=4, kernel=3, batch=2, seed=0):
    torch.manual_seed(seed)
    m = ContrastDrivenAggregation(in_channels, dim, heads, kernel_size=kernel)
    with torch.no_grad():
        for layer in (m.attn_fg, m.attn_bg):
            layer.weight.mul_(10)  # peaked attention: a misplaced window entry would show
    x = torch.randn(batch, in_channels, *size)
    fg, bg = torch.randn(batch, dim, *size), torch.randn(batch, dim, *size)
    return m, x, fg, bg


@pytest.mark.parametrize("size,kernel", [((16, 16), 3), ((7, 11), 3), ((1, 1), 3), ((2, 9), 3), ((9, 6), 5)])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_forward_equals_first_implementation_fp32(size, kernel, training, form):
    m, x, fg, bg = _module_and_inputs(size, kernel=kernel)
    m.train(training)
    m.form = form
    with torch.no_grad():
        ours = m(x, fg, bg)
        ref = reference_cdfa_forward(m, x, fg, bg)
    # 1e-4: in training mode the norms divide by the standard deviation of as few as 36 values, which
    # magnifies fp32 rounding differences between the two orders of summation (seen: 2.5e-5 with 2 threads)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_window_attention_equals_first_implementation_fp32():
    m, _, fg, _ = _module_and_inputs((12, 10), dim=64, heads=4)
    v = torch.randn(2, 64, 12, 10)
    with torch.no_grad():
        ours = m.window_attention(v, m.window_weights(fg, m.attn_fg))
        ref = reference_window_attention(m, v, reference_window_weights(m, fg, m.attn_fg))
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    # the weights are the same numbers in another layout
    weights = m.window_weights(fg, m.attn_fg)
    ref_weights = reference_window_weights(m, fg, m.attn_fg)  # (B, heads, HW, i, j)
    b, heads, _, _, h, w = weights.shape
    torch.testing.assert_close(weights.permute(0, 1, 4, 5, 2, 3).reshape(b, heads, h * w, 9, 9), ref_weights,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", FORMS)
def test_gradients_equal_first_implementation(form):
    # float64: in fp32 the train-mode BatchNorm backward amplifies rounding differences to ~1e-4
    m, x, fg, bg = _module_and_inputs((10, 13))
    m.double().train()
    grads = []
    for forward in (_in_form(form), lambda *a: reference_cdfa_forward(m, *a[1:])):
        m.zero_grad()
        inputs = [t.double().requires_grad_() for t in (x, fg, bg)]
        out = forward(m, *inputs)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        grads.append([t.grad for t in inputs] + [p.grad.clone() for p in m.parameters()])
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("size,kernel,heads", [((4, 5), 3, 2), ((1, 2), 3, 1), ((3, 2), 5, 1)])
def test_displacement_functions_gradcheck(size, kernel, heads):
    # the hand-written backward passes against numerical derivatives (fast mode: random projections)
    torch.manual_seed(0)
    k2, span = kernel * kernel, 2 * kernel - 1
    weights = torch.randn(1, heads, k2, k2, *size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: window_displacement_weights(a, kernel), (weights,), fast_mode=True)
    values = torch.randn(2, heads * 3, *size, dtype=torch.float64, requires_grad=True)
    displacement = torch.randn(2, heads, span, span, *size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(displacement_sum, (values, displacement), fast_mode=True)


def test_displacement_sum_by_hand():
    # one head, 1 x 3 image, 3 x 3 displacements: out(q) = sum_delta D_delta(q) v(q + delta), zero outside
    values = torch.tensor([[[[1.0, 2.0, 4.0]]]])
    displacement = torch.zeros(1, 1, 3, 3, 1, 3)
    displacement[0, 0, 1, 2] = 10.0  # delta = (0, +1): reads the right neighbour
    displacement[0, 0, 1, 1] = 1.0  # delta = 0
    displacement[0, 0, 0, 1] = 100.0  # delta = (-1, 0): outside the image, contributes nothing
    out = displacement_sum(values, displacement)
    torch.testing.assert_close(out, torch.tensor([[[[1.0 + 20.0, 2.0 + 40.0, 4.0]]]]))


def test_window_displacement_weights_by_hand():
    # k = 3, one pixel: only the window centred on it exists, i = j = centre gives delta = 0, and i = centre,
    # j = right gives delta = (0, +1); window positions i != centre write outside the 1 x 1 image
    weights = torch.zeros(1, 1, 9, 9, 1, 1)
    weights[0, 0, 4, 4] = 0.25
    weights[0, 0, 4, 5] = 0.5
    weights[0, 0, 0, 0] = 7.0  # i = top-left: writes to a pixel outside the image
    d = window_displacement_weights(weights, 3)
    expected = torch.zeros(1, 1, 5, 5, 1, 1)
    expected[0, 0, 2, 2] = 0.25
    expected[0, 0, 2, 3] = 0.5
    torch.testing.assert_close(d, expected)


def test_mixed_precision_inputs():
    # under autocast the values arrive in bf16 and the softmaxed weights in fp32: the sum is formed in fp32
    torch.manual_seed(0)
    values = torch.randn(1, 4, 5, 5).bfloat16().requires_grad_()
    displacement = torch.rand(1, 2, 5, 5, 5, 5, requires_grad=True)
    out = displacement_sum(values, displacement)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert values.grad.dtype == torch.bfloat16 and displacement.grad.dtype == torch.float32
    ref = displacement_sum(values.detach().float(), displacement.detach())
    torch.testing.assert_close(out, ref)


def test_displacement_functions_reject_bad_shapes():
    with pytest.raises(ValueError, match="weights must be"):
        window_displacement_weights(torch.zeros(1, 1, 9, 8, 2, 2), 3)
    with pytest.raises(ValueError, match="S odd"):
        displacement_sum(torch.zeros(1, 2, 3, 3), torch.zeros(1, 1, 4, 4, 3, 3))
    with pytest.raises(ValueError, match="do not match"):
        displacement_sum(torch.zeros(1, 3, 3, 3), torch.zeros(1, 2, 5, 5, 3, 3))


def test_current_implementation_saves_less_for_backward():
    # the unfolded windows (k*k copies of the values) are no longer kept for the backward pass
    m, x, fg, bg = _module_and_inputs((16, 16))
    m.train()

    def saved_elements(forward):
        total = []

        def pack(t):
            total.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward(x.requires_grad_(), fg, bg)
        return sum(total)

    assert saved_elements(lambda *a: m(*a)) < 0.8 * saved_elements(lambda *a: reference_cdfa_forward(m, *a))


# --- numerics under autocast: large-magnitude inputs, where a naive exp() of the logits overflows

def _cpu_autocast_or_skip(dtype: torch.dtype):
    """``torch.autocast('cpu', dtype)``; skips the test where this torch's CPU autocast lacks ``dtype``
    (older versions raise, or warn and disable autocast)."""
    try:
        with torch.autocast("cpu", dtype=dtype):
            probe = torch.nn.functional.linear(torch.ones(1, 2), torch.ones(3, 2))
    except RuntimeError as e:
        pytest.skip(f"CPU autocast does not support {dtype}: {e}")
    if probe.dtype != dtype:
        pytest.skip(f"CPU autocast does not support {dtype} (linear gave {probe.dtype})")
    return torch.autocast("cpu", dtype=dtype)


# (dtype, scale of x, scale of fg / bg). fp16: the guidance (hence the softmax logits) at 1e4, but x at 1e3:
# with x at 1e4 in eval mode the second window attention sums values ~1e4 from up to k*k windows, past
# fp16's largest number (65504), which no softmax can prevent.
AUTOCAST_CASES = [(torch.bfloat16, 1e3, 1e3), (torch.bfloat16, 1e4, 1e4), (torch.float16, 1e3, 1e4)]
# where exp() overflows: fp32 / bf16 above ~88.7, fp16 above ~11.1
EXP_OVERFLOW = {torch.float32: 88.8, torch.bfloat16: 88.8, torch.float16: 11.1}


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype,x_scale,guidance_scale", AUTOCAST_CASES,
                         ids=[f"{str(d)[6:]}-x{x:.0e}-g{g:.0e}" for d, x, g in AUTOCAST_CASES])
def test_autocast_large_inputs_finite_values_and_gradients(dtype, x_scale, guidance_scale, training, implementation):
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 32, 4).train(training)
    x = (torch.randn(2, 16, 8, 8) * x_scale).requires_grad_()
    fg = (torch.randn(2, 32, 8, 8) * guidance_scale).requires_grad_()
    bg = (torch.randn(2, 32, 8, 8) * guidance_scale).requires_grad_()
    with _cpu_autocast_or_skip(dtype):
        logits = m._pointwise(m.attn_fg, fg.detach()) * m.scale
        weights = m.window_weights(fg.detach(), m.attn_fg)
        out = IMPLEMENTATIONS[implementation](m, x, fg, bg)
    # the premise: these logits overflow a naive exp() in the dtype the softmax runs in
    assert logits.dtype == dtype and logits.abs().max() > EXP_OVERFLOW[dtype]
    assert not torch.isfinite(torch.exp(logits)).all()
    # softmax weights: finite, in [0, 1], each row sums to 1
    assert torch.isfinite(weights).all()
    assert weights.min() >= 0 and weights.max() <= 1
    torch.testing.assert_close(weights.float().sum(dim=3), torch.ones(2, 4, 9, 8, 8), rtol=0, atol=2e-2)
    assert out.shape == (2, 32, 8, 8) and out.dtype == dtype
    assert torch.isfinite(out).all()
    # a mean-reduced loss, as in training (a plain sum over 4096 outputs would scale the gradients by 4096)
    (out.float() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).mean().backward()
    for name, t in (("x", x), ("fg", fg), ("bg", bg)):
        assert t.grad is not None and torch.isfinite(t.grad).all(), name
    assert x.grad.abs().max() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("implementation", ["current", "graph"])
def test_fp32_large_inputs_finite_and_equal_to_first_implementation(training, implementation):
    # no autocast: logits ~1e3 (a naive exp overflows fp32); both implementations give the same finite result
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 32, 4).train(training)
    x, fg, bg = (torch.randn(2, c, 8, 8) * 1e3 for c in (16, 32, 32))
    assert (m._pointwise(m.attn_fg, fg) * m.scale).abs().max() > EXP_OVERFLOW[torch.float32]
    results = []
    for forward in (IMPLEMENTATIONS[implementation], IMPLEMENTATIONS["first"]):
        m.zero_grad()
        inputs = [t.clone().requires_grad_() for t in (x, fg, bg)]
        out = forward(m, *inputs)
        out.mean().backward()
        results.append([out.detach()] + [t.grad for t in inputs] + [p.grad.clone() for p in m.parameters()])
        assert all(torch.isfinite(t).all() for t in results[-1])
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("form", FORMS)
def test_fp16_autocast_survives_grown_scale_invariant_weights(training, form):
    # In training, value, projection and the first output convolution (all before a norm) grow under Adam
    # without weight decay. Grown by 30x each, the convolution's output leaves fp16's range; the block
    # computes that stretch in fp32, so under fp16 autocast its output stays finite and equal to fp32's.
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 32, 4).train()
    with torch.no_grad():
        for layer in (m.value, m.proj, m.output_convs[0].conv):
            layer.weight.mul_(30.0)
        for _ in range(20):  # running statistics as after training on such inputs (used in eval mode)
            m(*(torch.randn(2, c, 8, 8) for c in (16, 32, 32)))
    m.train(training)
    x, fg, bg = (torch.randn(2, c, 8, 8) for c in (16, 32, 32))
    pre_norm = []
    hook = m.output_convs[0].conv.register_forward_hook(lambda mod, i, o: pre_norm.append(o.abs().max().item()))
    with torch.no_grad():
        expected = m(x, fg, bg)
    hook.remove()
    # the premise: the first output convolution's output exceeds fp16's largest value
    assert pre_norm[0] > torch.finfo(torch.float16).max
    inputs = [t.clone().requires_grad_() for t in (x, fg, bg)]
    with _cpu_autocast_or_skip(torch.float16), implementation_form_of(m, form):
        out = m(*inputs)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
    out.float().mean().backward()
    for t in inputs:
        assert torch.isfinite(t.grad).all()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("dtype,stretch_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)],
                         ids=["fp16", "bf16"])
def test_fp32_stretch_only_under_fp16_autocast(dtype, stretch_dtype):
    # bf16 has fp32's exponent range, so under bf16 autocast (the CPU prediction switch) the stretch keeps
    # running in bf16, where it is fast; with the grown weights of the test above it stays finite there too.
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 32, 4).train()
    with torch.no_grad():
        for layer in (m.value, m.proj, m.output_convs[0].conv):
            layer.weight.mul_(30.0)
        for _ in range(20):
            m(*(torch.randn(2, c, 8, 8) for c in (16, 32, 32)))
    m.eval()
    seen = []
    hook = m.output_convs[0].conv.register_forward_hook(lambda mod, i, o: seen.append(o))
    x, fg, bg = (torch.randn(2, c, 8, 8) for c in (16, 32, 32))
    with torch.no_grad():
        expected = m(x, fg, bg)
        with _cpu_autocast_or_skip(dtype):
            out = m(x, fg, bg)
    hook.remove()
    assert seen[0].dtype == torch.float32 and seen[1].dtype == stretch_dtype
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, rtol=5e-2, atol=5e-2 * float(expected.abs().max()))


class _TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([ContrastDrivenAggregation(4, dim=8, num_heads=2) for _ in range(2)])


def test_a_form_set_on_one_network_changes_no_other_network_and_no_new_block(monkeypatch):
    ran = []

    def recorded(x, form=None):
        ran.append(device_forms.implementation_form(x, form))
        return ran[-1]
    monkeypatch.setattr(cdfa, "implementation_form", recorded)
    torch.manual_seed(0)
    inputs = [torch.randn(1, c, 5, 6) for c in (4, 8, 8)]

    def forms_run(net):
        ran.clear()
        with torch.no_grad():
            for block in net.blocks:
                block(*inputs)
        return list(ran)

    one, other = _TwoBlocks().eval(), _TwoBlocks().eval()
    assert form_blocks(one) == list(one.blocks)
    set_implementation_form(one, "graph")
    assert [b.form for b in one.blocks] == ["graph", "graph"]
    assert forms_run(one) == ["graph", "graph"]
    assert forms_run(other) == ["shifted", "shifted"]  # by device: the CPU's form
    assert ContrastDrivenAggregation(4, dim=8, num_heads=2).form is None
    other.blocks[1].form = "graph"
    with implementation_form_of(other, "cpu"):
        assert [b.form for b in other.blocks] == ["shifted", "shifted"]
        assert forms_run(one) == ["graph", "graph"]
    assert [b.form for b in other.blocks] == [None, "graph"]  # each block's own value again
    assert forms_run(other) == ["shifted", "graph"]
    with pytest.raises(KeyError), implementation_form_of(one, "shifted"):
        raise KeyError("an error inside the context")
    assert [b.form for b in one.blocks] == ["graph", "graph"]
    set_implementation_form(one, None)
    assert forms_run(one) == ["shifted", "shifted"]
