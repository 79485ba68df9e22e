"""The lightweight captioners: every equation against hand-computed tensors, training, decoding, saving.

Models are tiny (hidden 16, a 4×4 grid) so the whole file runs in seconds on one CPU thread; the
default configuration stays at the paper sizes.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from davir.errors import DataError
from davir.models.lightweight import (
    METHODS,
    LightweightConfig,
    build_lightweight_model,
    clevr_pair_loss,
    load_lightweight_model,
    paper_settings,
    prompt_texts,
    save_lightweight_model,
)
from davir.models.lightweight.attention import (
    MAX_LOG_SCALE,
    ScorerAttention,
    batch_token_matching,
    merge_heads,
    token_wise_matching,
)
from davir.models.lightweight.cheer import (
    Enhanced,
    EnhancementModule,
    consistency_loss,
    enhancement_probability,
    gated_residual,
)
from davir.models.lightweight.config import keys_of
from davir.models.lightweight.decoder import GatedDecoderLayer, beam_decode, greedy_decode, sinusoidal_table
from davir.models.lightweight.dirl import ccr_features, cross_modal_contrastive_loss, difference_tokens
from davir.models.lightweight.frontend import FeatureFrontend, coordinate_channels
from davir.models.lightweight.losses import (
    caption_cross_entropy,
    cross_correlation_loss,
    cross_correlation_matrix,
    gate_consistency_loss,
    info_nce,
    masked_mean,
)
from davir.models.lightweight.rdd import attribute_contrastive_loss, global_difference, regional_token
from davir.models.lightweight.scorer import reconstruct_both_views, sentence_feature
from davir.text.vocab import END_ID, START_ID, UNK_ID

B, C, GRID, K_ENT, ENT_DIM, TEXT_DIM = 4, 8, 4, 3, 6, 5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config(method: str, **overrides) -> LightweightConfig:
    values = dict(
        feat_dim=C,
        hidden=16,
        heads=2,
        word_emb=12,
        ffn_dim=32,
        vocab_size=12,
        max_len=7,
        dropout=0.0,
        encoder_layers=2,
        entity_dim=ENT_DIM,
        acr_text_dim=TEXT_DIM,
        acr_token_width=8,
        rdd_objects=3,
        rdd_actions=2,
    )
    values = {key: value for key, value in values.items() if key in keys_of(method)}  # each method takes its own
    return LightweightConfig(method=method, **{**values, **overrides})


def tiny_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    captions_in = torch.tensor(
        [[2, 4, 5, 6, 3, 0, 0], [2, 7, 8, 3, 0, 0, 0], [2, 9, 10, 11, 4, 3, 0], [2, 5, 3, 0, 0, 0, 0]]
    )
    captions_target = torch.tensor(
        [[4, 5, 6, 3, -1, -1, -1], [7, 8, 3, -1, -1, -1, -1], [9, 10, 11, 4, 3, -1, -1], [5, 3, -1, -1, -1, -1, -1]]
    )
    return {
        "feat_before": torch.randn(B, C, GRID, GRID, generator=g),
        "feat_after": torch.randn(B, C, GRID, GRID, generator=g),
        "captions_in": captions_in,
        "captions_target": captions_target,
        "entities": torch.randn(B, K_ENT, ENT_DIM, generator=g),
        "attributes": {
            "noun_features": torch.randn(B, TEXT_DIM, generator=g),
            "verb_features": torch.randn(B, TEXT_DIM, generator=g),
        },
    }


def extras(batch: dict) -> dict:
    return {"entities": batch["entities"], "attributes": batch["attributes"]}


# --- equations against hand-computed values ----------------------------------------------------------
def test_token_wise_matching_by_hand():
    # e = q kᵀ = [[1, 2, 0], [1, 0, 0.5]]; row maxima 2, 1 (mean 1.5); column maxima 1, 2, 0.5 (mean 7/6).
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, 0.5]])
    assert token_wise_matching(q, k).item() == pytest.approx(0.5 * (1.5 + 7 / 6))


def test_multi_head_token_matching_modes_by_hand():
    # Two samples, two heads of size 1, one query token and two key tokens each.
    # Sample a's query = (1, 2) over heads; keys of sample b: b0 = [(1, 0), (0, 1)], b1 = [(2, -1), (-1, 3)].
    query = torch.tensor([[1.0, 2.0], [0.0, 1.0]]).view(2, 1, 2).transpose(1, 2).reshape(2, 2, 1, 1)
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, -1.0], [-1.0, 3.0]]])  # (B, Nk, heads)
    key = keys.permute(0, 2, 1).unsqueeze(-1)  # (B, heads, Nk, 1)
    summed = batch_token_matching(query, key, "summed_heads")
    per_head = batch_token_matching(query, key, "per_head_mean")
    # summed: e = q·k over both heads. a0=(1,2) vs b0 keys: 1, 2 → TM = ½(max 2 + mean(1, 2)) = 1.75;
    # vs b1 keys: 2−2 = 0, −1+6 = 5 → ½(5 + 2.5) = 3.75. a1=(0,1) vs b0: 0, 1 → ½(1 + 0.5) = 0.75; vs b1: −1, 3 → ½(3 + 1) = 2.
    assert torch.allclose(summed, torch.tensor([[1.75, 3.75], [0.75, 2.0]]))
    # per head: a0 head0 q=1 vs b0 (1, 0): ½(1 + 0.5) = 0.75, head1 q=2 vs (0, 1): ½(2 + 1) = 1.5 → mean 1.125;
    # a0 vs b1: head0 (2, −1): ½(2 + 0.5) = 1.25; head1 q=2 vs (−1, 3): e = (−2, 6), ½(6 + 2) = 4 → 2.625;
    # a1 head0 q=0 → 0 everywhere; head1 q=1 vs (0, 1): ½(1 + 0.5) = 0.75, vs (−1, 3): ½(3 + 1) = 2 → 0.375, 1.0.
    assert torch.allclose(per_head, torch.tensor([[1.125, 2.625], [0.375, 1.0]]))
    assert torch.allclose(merge_heads(query).squeeze(1), torch.tensor([[1.0, 2.0], [0.0, 1.0]]))


def test_info_nce_two_by_two_by_hand():
    sim = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    rows = 0.5 * (math.log(1 + math.exp(-2)) + math.log(2))
    cols = 0.5 * (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-1)))
    assert info_nce(sim, symmetric=False).item() == pytest.approx(rows, abs=1e-6)
    assert info_nce(sim).item() == pytest.approx(0.5 * (rows + cols), abs=1e-6)
    halved = 0.5 * (math.log(1 + math.exp(-4)) + math.log(2))  # τ = 0.5 doubles the logits
    assert info_nce(sim, temperature=0.5, symmetric=False).item() == pytest.approx(halved, abs=1e-6)
    with pytest.raises(ValueError, match="square"):
        info_nce(torch.zeros(2, 3))


def test_cross_correlation_loss_by_hand():
    # z-scored columns: a → [-1, 0, 1], [-1, 1, 0]; b → [1, 0, -1], [-1, 0, 1] (unbiased std 1 each).
    z_a = torch.tensor([[1.0, 0.0], [2.0, 2.0], [3.0, 1.0]])
    z_b = torch.tensor([[3.0, 0.0], [2.0, 1.0], [1.0, 2.0]])
    c = cross_correlation_matrix(z_a, z_b, "zscore")
    assert torch.allclose(c, torch.tensor([[-2 / 3, 2 / 3], [-1 / 3, 1 / 3]]), atol=1e-6)
    expected = (1 + 2 / 3) ** 2 + (1 - 1 / 3) ** 2 + 0.003 * ((2 / 3) ** 2 + (1 / 3) ** 2)
    assert cross_correlation_loss(z_a, z_b, alpha=0.003, mode="zscore").item() == pytest.approx(expected, abs=1e-5)
    cosine = cross_correlation_matrix(z_a, z_b)  # Eq. 3 as printed, the default: no centring
    r70 = math.sqrt(70)
    assert torch.allclose(cosine, torch.tensor([[10 / 14, 8 / r70], [5 / r70, 4 / 5]]), atol=1e-6)
    printed = (1 - 10 / 14) ** 2 + (1 - 4 / 5) ** 2 + 0.003 * ((8 / r70) ** 2 + (5 / r70) ** 2)
    assert cross_correlation_loss(z_a, z_b, alpha=0.003).item() == pytest.approx(printed, abs=1e-5)


def test_gate_consistency_and_masked_mean_by_hand():
    assert gate_consistency_loss(torch.tensor([[0.2, 0.8]]), torch.tensor([[0.5, 0.4]])).item() == pytest.approx(0.125)
    x = torch.tensor([[[1.0], [3.0], [5.0], [7.0]]])
    assert masked_mean(x, torch.tensor([[1, 1, 1, 0]])).item() == pytest.approx(3.0)


def test_caption_cross_entropy_token_and_sentence_means():
    # V = 2. Logits (0, 0) cost ln 2; logits (ln 3, 0) with target 0 cost ln(4/3). -1 and <NULL> are ignored.
    logits = torch.zeros(2, 3, 2)
    logits[0, 1, 0] = math.log(3)
    token = caption_cross_entropy(logits, torch.tensor([[1, 0, -1], [1, -1, -1]]), ignore_ids=(-1,))
    assert token.item() == pytest.approx((2 * math.log(2) + math.log(4 / 3)) / 3, abs=1e-6)
    sentence = caption_cross_entropy(
        logits, torch.tensor([[1, 0, -1], [1, -1, -1]]), reduction="sentence_mean", ignore_ids=(-1,)
    )
    assert sentence.item() == pytest.approx(((math.log(2) + math.log(4 / 3)) / 2 + math.log(2)) / 2, abs=1e-6)
    # By default a target id 0 (<NULL>) is padding too: only the two ln 2 tokens remain.
    targets = torch.tensor([[1, 0, -1], [1, -1, -1]])
    assert caption_cross_entropy(logits, targets).item() == pytest.approx(math.log(2), abs=1e-6)


def test_frontend_coordinates_and_position_embedding():
    coords = coordinate_channels(2, 4)
    assert torch.allclose(coords[0], torch.tensor([[-1.0, -0.5, 0.0, 0.5]] * 2))
    assert torch.allclose(coords[1], torch.tensor([[-1.0] * 4, [0.0] * 4]))
    frontend = FeatureFrontend(feat_dim=3, hidden=4, grid_size=14, coord_channels=True)
    with torch.no_grad():
        frontend.projection.weight.zero_()
        frontend.projection.bias.zero_()
        frontend.projection.weight[0, 1, 0, 0] = 1.0  # output channel 0 = the x coordinate channel
        frontend.position.w_embedding.weight.copy_(torch.arange(28.0).view(14, 2))
        frontend.position.h_embedding.weight.copy_(100 + torch.arange(28.0).view(14, 2))
    tokens = frontend(torch.zeros(1, 1, 2, 4))  # 1 channel + 2 coordinates = feat_dim 3
    # token (r=1, c=2) is index 6: conv gives x = 0 on channel 0; pos = (w[2], h[1]) = (4, 5, 102, 103).
    assert torch.allclose(tokens[0, 6], torch.tensor([4.0, 5.0, 102.0, 103.0]))
    assert tokens[0, 1, 0].item() == pytest.approx(-0.5 + 2.0)  # (r=0, c=1): x = −0.5, w[1][0] = 2
    with pytest.raises(ValueError, match="channels"):
        frontend(torch.zeros(1, 3, 2, 4))


def test_scorer_layers_update_both_views_from_previous_layer():
    class Probe(nn.Module):  # out = q + 10·k, so the arguments of every call can be read back
        def forward(self, q, k, need):
            return q + 10 * k, None

    before, after, _, _ = reconstruct_both_views(
        nn.ModuleList([Probe(), Probe()]), torch.tensor(1.0), torch.tensor(2.0), need_similarity=False
    )
    # layer 1: bef 1 + 20 = 21, aft 2 + 10·1 = 12 (old bef); layer 2: 21 + 120 = 141, 12 + 210 = 222.
    assert (before.item(), after.item()) == (141.0, 222.0)


def test_scorer_attention_has_no_output_projection():
    attention = ScorerAttention(4, 2, dropout=0.0)
    with torch.no_grad():
        for linear in (attention.query, attention.key, attention.value):
            linear.weight.copy_(torch.eye(4))
            linear.bias.zero_()
    x = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    y = torch.tensor([[[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]])
    out, _, _ = attention(x, y)
    # head 0 (dims 0-1): scores (0, 2)/√2 → weights softmax; value rows (0,1), (2,0); head 1 sees zeros → uniform.
    w = torch.softmax(torch.tensor([0.0, 2.0 / math.sqrt(2)]), 0)
    assert torch.allclose(out[0, 0], torch.tensor([2 * w[1], w[0], 0.0, 0.0]))


@pytest.mark.parametrize("method", ["scorer", "cheer"])
def test_difference_init_starts_the_fusion_as_after_minus_before(method):
    """[D] difference_init: SCORER's Eq. 7 / CHEER's Eq. 12 fusion of [X_bef; X_aft] starts as ReLU(X_aft − X_bef)
    (CHEER with its [D] ReLU after Eq. 12, `cheer_fusion_relu`; Eq. 12 as printed is the Linear alone)."""
    config = LightweightConfig(
        method=method,
        hidden=4,
        heads=2,
        word_emb=4,
        ffn_dim=8,
        dropout=0.0,
        difference_init=True,
        **({"entity_dim": 12, "cheer_fusion_relu": True} if method == "cheer" else {}),
    )
    fuse = lambda model: model.fuse
    model = build_lightweight_model(config).eval()
    before = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    after = torch.tensor([[[2.0, 0.0, 3.0, 7.0]]])
    fused = fuse(model)(torch.cat([before, after], dim=-1))
    assert torch.equal(fused, torch.tensor([[[1.0, 0.0, 0.0, 3.0]]]))  # ReLU(1, −2, 0, 3)
    plain = build_lightweight_model(dataclasses.replace(config, difference_init=False)).eval()
    assert not torch.equal(fuse(plain)(torch.cat([before, after], dim=-1)), fused)
    if method == "cheer":  # Eq. 12 as printed: the difference itself, negative parts kept
        printed = build_lightweight_model(dataclasses.replace(config, cheer_fusion_relu=False)).eval()
        assert torch.equal(printed.fuse(torch.cat([before, after], dim=-1)), torch.tensor([[[1.0, -2.0, 0.0, 3.0]]]))


@pytest.mark.parametrize("method", ["scorer", "dirl", "cheer"])
def test_matching_init_makes_the_first_cross_view_attention_find_each_tokens_counterpart(method):
    """[D] matching_init: with W_K = W_Q a before token attends most to the same content in the after image
    (here a permuted copy of the before tokens); with the papers' independent init it does not."""
    torch.manual_seed(0)
    tokens = torch.randn(2, 49, 64)
    order = torch.randperm(49)
    shuffled = tokens[:, order]  # shuffled[:, j] = tokens[:, order[j]]: token i's counterpart is at order⁻¹[i]
    counterpart = torch.argsort(order)
    share = {}
    for tied in (False, True):
        config = LightweightConfig(
            method=method,
            hidden=64,
            heads=4,
            word_emb=32,
            ffn_dim=128,
            dropout=0.0,
            matching_init=tied,
            encoder_layers=1,
            **({"entity_dim": 12} if method == "cheer" else {}),
        )
        model = build_lightweight_model(config)
        if method == "dirl":
            attention = model.cross_layers[0].attention
            _, weights = attention(tokens, shuffled, shuffled, need_weights=True)  # (B, 49, 49), mean of heads
        else:
            layer = model.layers[0] if method == "scorer" else model.hrd_layers[0].interaction
            _, query, key = layer.attention(tokens, shuffled)
            weights = (query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])).softmax(-1).mean(1)
        found = weights.argmax(-1) == counterpart  # (B, 49)
        share[tied] = found.float().mean().item()
        value = attention.in_proj_weight[128:] if method == "dirl" else layer.attention.value.weight
        assert torch.equal(value, torch.eye(64)) == tied  # W_V = I: an unchanged token reconstructs as itself
    assert share[True] > 0.9 and share[False] < 0.2, share


def test_cbr_sentence_feature_clean_and_padded():
    hidden = torch.tensor([[[1.0], [3.0], [5.0], [7.0]]])
    captions_in = torch.tensor([[START_ID, 5, END_ID, 0]])
    assert sentence_feature(hidden, captions_in, padded_mean=False).item() == pytest.approx(3.0)
    assert sentence_feature(hidden, captions_in, padded_mean=True).item() == pytest.approx(2.25)


def test_dirl_difference_and_ccr_by_hand():
    assert torch.equal(difference_tokens(torch.tensor([3.0]), torch.tensor([1.0])), torch.tensor([2.0]))
    text, visual = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # sim = T·Vᵀ = [[1, 1], [0, 1]]; /τ=0.5 → [[2, 2], [0, 2]]: rows ln 2, ln(1+e^-2); columns the same pair.
    paper = 0.5 * (math.log(2) + math.log(1 + math.exp(-2)))
    assert cross_modal_contrastive_loss(text, visual, temperature=0.5, mode="paper").item() == pytest.approx(
        paper, abs=1e-6
    )
    # code: (S + Sᵀ)/2 = [[1, .5], [.5, 1]] / 0.5 → rows ln(1 + e^-1).
    code = math.log(1 + math.exp(-1))
    assert cross_modal_contrastive_loss(text, visual, temperature=0.5, mode="code").item() == pytest.approx(
        code, abs=1e-6
    )
    states = torch.tensor([[[2.0], [4.0], [9.0]]])
    t, v = ccr_features(states, 2 * states, torch.tensor([[2, 3, 0]]), "paper")
    assert (t.item(), v.item()) == (3.0, 6.0)
    t, v = ccr_features(states, 2 * states, torch.tensor([[2, 3, 0]]), "code")  # padding included [C]
    assert t.item() == pytest.approx(5.0)


def test_rdd_equations_by_hand():
    assert torch.equal(global_difference(torch.tensor([1.0]), torch.tensor([4.0])), torch.tensor([3.0]))
    assert torch.allclose(regional_token(torch.tensor([[[1.0, 2.0], [3.0, 6.0]]])), torch.tensor([[2.0, 4.0]]))
    text, region = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    s = 1 / math.sqrt(2)  # cosine matrix [[1, s], [0, s]]
    rows = 0.5 * (math.log(1 + math.exp(s - 1)) + math.log(1 + math.exp(-s)))
    cols = 0.5 * (math.log(1 + math.exp(0 - 1)) + math.log(1 + math.exp(s - s)))
    assert attribute_contrastive_loss(text, region, 1.0).item() == pytest.approx(0.5 * (rows + cols), abs=1e-6)


def test_rdd_encoder_sees_only_the_difference_and_hands_the_decoder_the_global_tokens(tmp_path):
    torch.manual_seed(0)
    model = build_lightweight_model(tiny_config("rdd")).eval()
    x, y = torch.randn(2, GRID * GRID, 16), torch.randn(2, GRID * GRID, 16)
    # Eqs. 3-4 as printed (no residual, the default): with nothing changed, F_diff = 0 and GDE's output does not
    # depend on the image at all — the post-LN version carried each image's own content into F_c.
    assert torch.allclose(model.gde(x, x), model.gde(y, y), atol=1e-6)
    assert not torch.allclose(model.gde(x, y), model.gde(x, x), atol=1e-3)
    # Eq. 5 as printed (the default): F_c = [F^_bef; F^_aft] along the tokens, no layer: 2·H·W tokens of width D,
    # and the decoder reads all of them (F_c's part of Eq. 9's output).
    assert model.gde_fuse is None
    attended = [model.gde_attention(z, y - x, y - x)[0] for z in (x, y)]
    assert torch.allclose(model.gde(x, y), torch.cat(attended, dim=1), atol=1e-6)
    memory = model.encode(x, y, need_losses=False).memory
    assert memory.shape == (2, 2 * GRID * GRID, 16)
    # The [D] Linear fusion with the [D] residual that carries the difference token itself: with the attention
    # silenced (W_O = 0), F^_bef = F^_aft = F_aft − F_bef, where the printed Eqs. 3-4 leave nothing.
    linear = build_lightweight_model(tiny_config("rdd", rdd_gde_residual="difference", rdd_fusion="linear")).eval()
    assert linear.encode(x, y, need_losses=False).memory.shape == (2, GRID * GRID, 16)
    with torch.no_grad():
        linear.gde_attention.out_proj.weight.zero_()
        linear.gde_attention.out_proj.bias.zero_()
    fuse = linear.gde_fuse[0]
    assert torch.allclose(linear.gde(x, y), fuse(torch.cat([y - x, y - x], dim=-1)).relu(), atol=1e-6)
    linear.config.rdd_gde_residual = "none"
    assert torch.allclose(linear.gde(x, y), fuse.bias.relu().expand(2, GRID * GRID, 16), atol=1e-6)
    # difference_init starts Eq. 5's Linear, which the printed concatenation does not have: refused with the fix
    with pytest.raises(ValueError, match="difference_init starts Eq. 5's fusion Linear.*rdd_fusion='linear'"):
        tiny_config("rdd", difference_init=True)
    # [D] the demo's "image" residual F^_x = F_x + MHCA(F_x, F_diff) carries each image's content; with
    # difference_init Eq. 5's Linear starts as F^_aft − F^_bef: nothing for an unchanged pair, and the
    # difference of the two enriched images otherwise.
    content = build_lightweight_model(
        tiny_config("rdd", rdd_gde_residual="image", rdd_fusion="linear", difference_init=True)
    ).eval()
    assert torch.equal(content.gde_fuse[0].weight, torch.cat([-torch.eye(16), torch.eye(16)], dim=1))
    assert torch.equal(content.gde(x, x), torch.zeros_like(x))
    enriched = [z + content.gde_attention(z, y - x, y - x)[0] for z in (x, y)]
    assert torch.allclose(content.gde(x, y), (enriched[1] - enriched[0]).relu(), atol=1e-6)
    # With the F_diff residual the same Linear cancels F_diff itself: only the attention terms are left.
    content.config.rdd_gde_residual = "difference"
    assert torch.allclose(content.gde(x, y), (enriched[1] - y - enriched[0] + x).relu(), atol=1e-6)
    # Eq. 9 by hand: X = [F_c; O; A], X + MHSA(X), then + FFN; the decoder reads the H·W global tokens.
    f_c, o, a = torch.randn(2, 5, 16), torch.randn(2, 3, 16), torch.randn(2, 2, 16)
    tokens = torch.cat([f_c, o, a], dim=1)
    attended = tokens + model.fusion_attention(tokens, tokens, tokens)[0]
    expected = attended + model.fusion_ffn[3](model.fusion_ffn[0](attended).relu())
    assert torch.allclose(model.fuse(f_c, o, a), expected[:, :5], atol=1e-6)
    model.config.rdd_decoder_tokens = "all"
    assert torch.allclose(model.fuse(f_c, o, a), expected, atol=1e-6)
    # A checkpoint of the earlier post-LN encoder is refused with a reason, not a key listing.
    state = model.state_dict()
    state["gde_attention.norm.weight"] = torch.ones(16)
    with pytest.raises(ValueError, match="post-LN encoder"):
        model.load_state_dict(state)
    path = tmp_path / "old_rdd.safetensors"
    save_lightweight_model(model, path)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    save_file(state, str(path), metadata=metadata)
    with pytest.raises(
        DataError, match="old_rdd.safetensors: this RDD checkpoint was trained with the earlier post-LN"
    ):
        load_lightweight_model(path)


def test_cheer_enhancement_by_hand():
    target = torch.tensor([[[1.0, 0.0]]])
    source = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    probs = enhancement_probability(target, source, torch.tensor(1.0))  # softmax of cos (1, 0)
    e = math.e
    assert torch.allclose(probs, torch.tensor([[[e / (e + 1), 1 / (e + 1)]]]))
    # Eq. 2 as printed (the default): a plain softmax, no temperature parameter; [D] a learnable τ_e
    cre, dre = EnhancementModule(2, "commonality"), EnhancementModule(2, "difference")
    assert cre.log_temperature is None and not any("temperature" in name for name, _ in cre.named_parameters())
    for module in (cre, dre):
        with torch.no_grad():
            module.expand.weight.fill_(2.0)
            module.expand.bias.fill_(-1.0)
    common = cre(source, target)
    assert common.score.item() == pytest.approx(e / (e + 1))
    assert common.logits[0, 0, 0].item() == pytest.approx(2 * e / (e + 1) - 1)  # P^ = Linear(max_j P), Eq. 3
    assert common.gate[0, 0, 0].item() == pytest.approx(1 / (1 + math.exp(-(2 * e / (e + 1) - 1))))
    assert dre(source, target).score.item() == pytest.approx(1 / (e + 1))
    sharp = EnhancementModule(2, "commonality", 0.5)  # τ_e = 0.5: softmax of (2, 0)
    assert sharp.match_map(source, target).item() == pytest.approx(math.exp(2) / (math.exp(2) + 1), rel=1e-5)
    assert float(sharp.log_temperature.detach().exp()) == pytest.approx(0.5)
    enhanced, gate = gated_residual(torch.tensor([[3.0, 1.0]]), torch.tensor([[0.0, 100.0]]), nn.LayerNorm(2))
    # σ = (0.5, 1): (1.5·3 + ... ) → (4.5, 2) → LN → (1, −1)
    assert torch.allclose(gate, torch.tensor([[0.5, 1.0]]))
    assert torch.allclose(enhanced, torch.tensor([[1.0, -1.0]]), atol=1e-4)


def test_cheer_consistency_compares_the_gate_logits_and_the_decoder_weights_are_plain_linears():
    """Eqs. 7 / 11 as printed: MSE(P^, P^') of the logits, before σ; the [D] options compare σ(P^), the match maps
    or their correlation. Eqs. 14-15 as printed: α, β are the Linear outputs; [D] σ of them."""
    logits = torch.tensor([[[2.0, 0.0]]])
    image_side = Enhanced(None, logits, torch.sigmoid(logits), torch.tensor([[0.9, 0.1]]))
    entity_side = Enhanced(None, torch.zeros(1, 1, 2), torch.full((1, 1, 2), 0.5), torch.tensor([[0.5, 0.3]]))
    assert consistency_loss(image_side, entity_side, "logits").item() == pytest.approx(2.0)  # (2² + 0²) / 2
    sig = 1 / (1 + math.exp(-2))
    assert consistency_loss(image_side, entity_side, "gate").item() == pytest.approx((sig - 0.5) ** 2 / 2)
    assert consistency_loss(image_side, entity_side, "map").item() == pytest.approx((0.4**2 + 0.2**2) / 2)
    assert consistency_loss(image_side, entity_side, "correlation").item() == pytest.approx(0.0, abs=1e-4)  # same shape

    torch.manual_seed(0)
    layer = GatedDecoderLayer(4, 1, 8, 0.0).eval()
    h, memory, entities = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 2, 4)
    text, visual = layer.text_attention(h, entities, entities)[0], layer.visual_attention(h, memory, memory)[0]
    alpha, beta = layer.alpha(torch.cat([h, text], dim=-1)), layer.beta(torch.cat([h, visual], dim=-1))
    assert torch.allclose(
        layer.gated_fusion(h, memory, entities), layer.norm(alpha * text + beta * visual + h), atol=1e-6
    )
    layer.sigmoid_gates = True
    expected = layer.norm(torch.sigmoid(alpha) * text + torch.sigmoid(beta) * visual + h)
    assert torch.allclose(layer.gated_fusion(h, memory, entities), expected, atol=1e-6)
    assert not build_lightweight_model(tiny_config("cheer")).decoder.layers[0].sigmoid_gates
    assert build_lightweight_model(tiny_config("cheer", decoder_gate_sigmoid=True)).decoder.layers[0].sigmoid_gates


def test_sinusoidal_table_matches_formula():
    table = sinusoidal_table(5, 6)
    assert table[3, 2].item() == pytest.approx(math.sin(3 / 10000 ** (2 / 6)))
    assert table[3, 3].item() == pytest.approx(math.cos(3 / 10000 ** (2 / 6)))


# --- decoding -----------------------------------------------------------------------------------------
def scripted_step(table: dict[tuple[int, ...], dict[int, float]], vocab: int = 6):
    """A step function returning fixed probabilities for each word history (rows without entry: END)."""

    def step(tokens: torch.Tensor) -> torch.Tensor:
        out = torch.full((tokens.shape[0], vocab), 1e-9)
        for row, history in enumerate(tokens.tolist()):
            probs = table.get(tuple(history[1:]), {END_ID: 1.0})
            for word, p in probs.items():
                out[row, word] = p
        return out.log()

    return step


def test_beam_search_finds_the_better_sequence_and_beam_one_is_greedy():
    # Greedy takes 4 (0.6) then END (0.55) = 0.33; beam 2 finds 5, END = 0.4 × 0.99 = 0.396.
    table = {(): {4: 0.6, 5: 0.4}, (4,): {END_ID: 0.55, 5: 0.45}, (5,): {END_ID: 0.99, 4: 0.01}}
    step = scripted_step(table)
    assert greedy_decode(step, 1, 5, "cpu").tolist() == [[4, 0]]
    assert beam_decode(step, 1, 1, 5, "cpu").tolist() == [[4, 0]]
    assert beam_decode(step, 1, 2, 5, "cpu").tolist() == [[5, 0]]
    # Without <END> before max_len, all max_len words come back and no trailing 0.
    endless = scripted_step({(): {4: 1.0}, (4,): {4: 1.0}, (4, 4): {4: 1.0}})
    assert greedy_decode(endless, 1, 3, "cpu").tolist() == [[4, 4, 4]]
    assert beam_decode(endless, 1, 3, 3, "cpu").tolist() == [[4, 4, 4]]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_equals_beam_one_and_unk_is_never_generated(method):
    torch.manual_seed(1)
    model = build_lightweight_model(tiny_config(method))
    with torch.no_grad():
        model.decoder.logit.bias[UNK_ID] = 50.0  # UNK would win every step if it were not suppressed
    batch = tiny_batch()
    greedy = model.generate(batch["feat_before"], batch["feat_after"], **extras(batch))
    beam = model.generate(batch["feat_before"], batch["feat_after"], beam_size=1, **extras(batch))
    assert greedy.dtype == torch.long and greedy.shape[0] == B and greedy.shape[1] <= 7
    assert torch.equal(greedy, beam)
    assert not bool((greedy == UNK_ID).any())
    beam3 = model.generate(batch["feat_before"], batch["feat_after"], beam_size=3, max_len=5, **extras(batch))
    assert beam3.shape[0] == B and beam3.shape[1] <= 5


# --- training, saving ---------------------------------------------------------------------------------
EXPECTED_LOSSES = {
    "subtraction": set(),
    "scorer": {"cv_loss", "cbr_loss"},
    "dirl": {"dirl_loss", "ccr_loss"},
    "rdd": {"n2o_loss", "v2a_loss"},
    "cheer": {"commonality_gate_loss", "difference_gate_loss", "contrastive_loss"},
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_training_steps_reduce_the_loss(method):
    torch.manual_seed(0)
    model = build_lightweight_model(tiny_config(method))
    batch = tiny_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        out = model(
            batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"], **extras(batch)
        )
        assert set(out) == {"loss", "caption_loss"} | EXPECTED_LOSSES[method]
        weights = model.loss_weights()
        total = out["caption_loss"] + sum(weights[k] * out[k] for k in EXPECTED_LOSSES[method])
        assert out["loss"].item() == pytest.approx(total.item(), rel=1e-5)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        model.after_optimizer_step()
        losses.append(out["loss"].item())
    assert losses[-1] < 0.75 * losses[0], losses


@pytest.mark.parametrize("method", sorted(METHODS))
def test_safetensors_round_trip_gives_identical_captions(method, tmp_path):
    torch.manual_seed(2)
    model = build_lightweight_model(tiny_config(method, **({"entity_bank_size": 5} if method == "cheer" else {})))
    batch = tiny_batch(1)
    before = model.generate(batch["feat_before"], batch["feat_after"], **extras(batch))
    save_lightweight_model(model, tmp_path / "model.safetensors")
    torch.manual_seed(99)  # a differently initialised model must become identical after loading
    restored = load_lightweight_model(tmp_path / "model.safetensors")
    assert torch.equal(restored.generate(batch["feat_before"], batch["feat_after"], **extras(batch)), before)
    plain = build_lightweight_model(model.config)
    save_file(model.state_dict(), str(tmp_path / "plain.safetensors"))
    plain.load_state_dict(load_file(str(tmp_path / "plain.safetensors")))
    assert torch.equal(plain.generate(batch["feat_before"], batch["feat_after"], **extras(batch)), before)


def test_load_rejects_a_foreign_file(tmp_path):
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(DataError, match="not a davir lightweight model"):
        load_lightweight_model(tmp_path / "other.safetensors")
    with pytest.raises(DataError, match="missing"):
        load_lightweight_model(tmp_path / "absent.safetensors")


def test_clevr_pair_loss_averages_both_pairs_and_swaps_roles():
    torch.manual_seed(3)
    model = build_lightweight_model(tiny_config("scorer"))
    batch = tiny_batch()
    batch["feat_distractor"] = torch.randn(B, C, GRID, GRID)
    batch["no_change_in"] = torch.tensor([[2, 4, 3, 0, 0, 0, 0]] * B)
    batch["no_change_target"] = torch.tensor([[4, 3, -1, -1, -1, -1, -1]] * B)
    model.eval()  # no swap at evaluation
    combined = clevr_pair_loss(model, batch)
    semantic = model(batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"])
    distractor = model(batch["feat_before"], batch["feat_distractor"], batch["no_change_in"], batch["no_change_target"])
    for key in ("loss", "caption_loss", "cv_loss", "cbr_loss"):
        assert combined[key].item() == pytest.approx(0.5 * (semantic[key] + distractor[key]).item(), rel=1e-5)
    model.train()  # dropout is 0, so only the swap differs
    swap = torch.rand(B, generator=torch.Generator().manual_seed(7)) < 0.5
    assert 0 < int(swap.sum()) < B
    combined = clevr_pair_loss(model, batch, generator=torch.Generator().manual_seed(7))
    view = swap.view(-1, 1, 1, 1)
    before = torch.where(view, batch["feat_distractor"], batch["feat_before"])
    other = torch.where(view, batch["feat_before"], batch["feat_distractor"])
    semantic = model(before, batch["feat_after"], batch["captions_in"], batch["captions_target"])
    distractor = model(before, other, batch["no_change_in"], batch["no_change_target"])
    assert combined["loss"].item() == pytest.approx(0.5 * (semantic["loss"] + distractor["loss"]).item(), rel=1e-5)
    with pytest.raises(KeyError, match="feat_distractor"):
        clevr_pair_loss(model, {"feat_before": batch["feat_before"]})


# --- method-specific switches ---------------------------------------------------------------------------
def test_scorer_reference_quirks_freeze_cbr_and_use_the_code_decoder():
    torch.manual_seed(4)
    model = build_lightweight_model(tiny_config("scorer", reference_quirks=True))
    assert model.decoder.layers[0].__class__.__name__ == "ScorerDecoderLayer"
    frozen = {k: v.clone() for k, v in model.cbr.state_dict().items()}
    batch = tiny_batch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = model(batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"])
    out["loss"].backward()
    assert model.frontend.projection.weight.grad is not None  # CBR's gradient still reaches the projection
    optimizer.step()
    assert all(torch.equal(frozen[k], v) for k, v in model.cbr.state_dict().items())
    with torch.no_grad():
        model.layers[-1].logit_scale.log_scale.fill_(10.0)
    model.after_optimizer_step()
    assert model.layers[-1].logit_scale.log_scale.item() == pytest.approx(MAX_LOG_SCALE)


def test_rdd_requires_attributes_in_training_and_accepts_a_clip_text_tower():
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(5)
    clip = CLIP(
        embed_dim=TEXT_DIM,
        vision_cfg=CLIPVisionCfg(layers=1, width=16, head_width=8, patch_size=8, image_size=16),
        text_cfg=CLIPTextCfg(context_length=10, vocab_size=40, width=8, heads=2, layers=1),
    )
    model = build_lightweight_model(tiny_config("rdd"), text_tower=clip)
    batch = tiny_batch()
    with pytest.raises(ValueError, match="attributes"):
        model(batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"])
    # CLIP-style ids: <SOT>=38, four placeholders (5), segment words, <EOT>=39 (the highest id), padding.
    ids = torch.tensor([[38, 5, 5, 5, 5, 7, 8, 39, 0, 0], [38, 5, 5, 5, 5, 9, 39, 0, 0, 0]] * 2)
    # With the placeholders' own embeddings as context, the prompt path equals CLIP's encode_text.
    placeholder = clip.token_embedding.weight[5].detach().expand(4, -1)
    assert torch.allclose(model.text_tower(ids, placeholder), clip.encode_text(ids), atol=1e-5)
    out = model(
        batch["feat_before"],
        batch["feat_after"],
        batch["captions_in"],
        batch["captions_target"],
        attributes={"noun_ids": ids, "verb_ids": ids.flip(0)},
    )
    out["loss"].backward()
    assert model.noun_context.grad is not None and model.noun_context.grad.abs().sum() > 0
    assert clip.token_embedding.weight.grad is None  # the tower stays frozen
    state = model.state_dict()
    assert not any("text_tower" in key for key in state)
    fresh = build_lightweight_model(tiny_config("rdd"))
    fresh.load_state_dict(state)  # strict: the tower's absence is not a missing key
    assert prompt_texts(["red cube and blue ball"]) == ["X X X X red cube and blue ball."]


def test_cheer_entity_ids_through_the_bank_equal_embeddings():
    torch.manual_seed(6)
    model = build_lightweight_model(tiny_config("cheer", entity_bank_size=5)).eval()
    bank = torch.randn(5, ENT_DIM)
    model.set_entity_bank(bank)
    ids = torch.tensor([[0, 1, 2], [4, 3, 2], [1, 1, 1], [0, 4, 2]])
    batch = tiny_batch()
    by_id = model(
        batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"], entities=ids
    )
    by_embedding = model(
        batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"], entities=bank[ids]
    )
    assert by_id["loss"].item() == pytest.approx(by_embedding["loss"].item(), rel=1e-6)
    with pytest.raises(ValueError, match="entities"):
        model(batch["feat_before"], batch["feat_after"], batch["captions_in"], batch["captions_target"])


def test_config_defaults_paper_settings_and_input_checks():
    default = LightweightConfig()
    assert (default.hidden, default.word_emb, default.heads, default.layers, default.feat_dim) == (512, 300, 8, 2, 1024)
    assert LightweightConfig(method="rdd").resolved_positions == "learned"
    assert LightweightConfig(method="rdd").resolved_caption_loss == "sentence_mean"
    model_fields, trainer = paper_settings("scorer", "spot_the_diff")
    assert model_fields == {"cv_weight": 0.3, "cbr_weight": 0.5, "encoder_layers": 3} and trainer["batch_size"] == 32
    assert paper_settings("dirl", "clevr_change")[0]["feat_dim"] == 1026
    with pytest.raises(KeyError, match="no settings"):
        paper_settings("rdd", "ier")
    with pytest.raises(ValueError, match="unknown lightweight method"):
        LightweightConfig(method="transformer")
    model = build_lightweight_model(tiny_config("subtraction"))
    batch = tiny_batch()
    with pytest.raises(ValueError, match="START"):
        model(
            batch["feat_before"], batch["feat_after"], batch["captions_target"].clamp(min=0), batch["captions_target"]
        )
    with pytest.raises(ValueError, match="max_len"):
        model.generate(batch["feat_before"], batch["feat_after"], max_len=8)


# --- vocabulary (§0.5) ------------------------------------------------------------------------------------
def test_tokenizer_rules():
    from davir.text.vocab import tokenize

    assert tokenize("the big cube changed to red; the ball moved, too.") == [
        "the",
        "big",
        "cube",
        "changed",
        "to",
        "red",
        ";",
        "the",
        "ball",
        "moved",
        ",",
        "too",
    ]
    assert tokenize("is there a difference?") == ["is", "there", "a", "difference"]
    assert tokenize("Keep  Case ") == ["Keep", "Case"]  # no lower-casing; empty tokens dropped


def test_vocabulary_matches_the_real_clevr_change_vocabulary(shared_datasets, tmp_path):
    from davir.text.vocab import Vocabulary

    path = shared_datasets / "clevr_change" / "transformer_vocab.json"
    real = Vocabulary.load(path)
    assert len(real) == 76
    words = [w for w in real.word_to_id if not w.startswith("<")]
    # Built from the same 72 words (in any order, with repeats), our ids equal the reference file's.
    rebuilt = Vocabulary.build([" ".join(reversed(words)), "the cube is gone.", "there is no change"])
    assert rebuilt.word_to_id == real.word_to_id
    # min_count drops words seen fewer times (ids stay dense and sorted).
    assert [w for w in Vocabulary.build(["b a a", "c a b"], min_count=2).word_to_id] == [
        "<NULL>",
        "<UNK>",
        "<START>",
        "<END>",
        "a",
        "b",
    ]
    caption = (
        "the tiny green rubber cylinder that was on the left side of the big gray metal thing has been newly placed."
    )
    ids = real.encode(caption)
    assert ids[0] == START_ID and ids[-1] == END_ID and UNK_ID not in ids
    assert ids[1:4] == [67, 70, 28]  # the, tiny, green in the reference file
    assert real.decode(ids) == caption.rstrip(".")
    assert real.encode("a purple zebra")[1:-1] == [4, 53, UNK_ID]
    with pytest.raises(DataError, match="zebra"):
        real.encode("a purple zebra", allow_unk=False)
    captions_in, captions_target = real.caption_tensors(["the cube is gone.", "no change"], max_len=7)
    cube, gone = real.word_to_id["cube"], real.word_to_id["gone"]
    assert captions_in[0].tolist() == [2, 67, cube, 32, gone, 3, 0]
    assert captions_target[0].tolist() == [67, cube, 32, gone, 3, -1, -1]
    assert captions_target[1].tolist() == [46, 17, 3, -1, -1, -1, -1]
    with pytest.raises(DataError, match="max_len"):
        real.caption_tensors([caption], max_len=10)
    real.save(tmp_path / "vocab.json")
    assert Vocabulary.load(tmp_path / "vocab.json") == real
    (tmp_path / "bad.json").write_text('{"<NULL>": 0, "<UNK>": 2}')
    with pytest.raises(DataError, match="bad.json"):
        Vocabulary.load(tmp_path / "bad.json")
