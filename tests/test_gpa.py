"""GPA: the progressive codebook (checkpointing, refresh schedule, eval purity) and the attention around it."""

from __future__ import annotations

import torch

from lra_bench.registry import build_attention, build_selector
from lra_bench.run.build import build_network as build_classifier
from models.landmarks.kmeans import KMeansConfig, KMeansSelector

B, H, N, D = 2, 2, 32, 8


def gpa(refresh_every: int = 3, seq_len: int = N, **kw) -> torch.nn.Module:
    sel = build_selector("gpa", refresh_every=refresh_every, max_iterations=5)
    return build_attention("gpa", head_dim=D, num_heads=H, seq_len=seq_len, selector=sel, conv_kernel=0, **kw)


def batch(seed: int, n: int = N) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g) for _ in range(3)]


def test_log2_landmarks_and_codebook_shape() -> None:
    module = gpa(seq_len=64)
    assert module.rank_budget(64) == 6
    assert module.rank_budget(16) == 6, "the codebook size is fixed for the configured length"
    assert module.selector.codebook.shape == (H, 6, D)


def test_refresh_happens_on_schedule() -> None:
    module = gpa(refresh_every=3).train()
    refreshes, books = [], []
    for step in range(7):
        module(*batch(step), None)
        refreshes.append(int(module.selector.refreshes))
        books.append(module.selector.codebook.clone())
    assert refreshes == [1, 1, 1, 2, 2, 2, 3], "refresh at passes 1, 4, 7"
    assert int(module.selector.passes) == 7
    assert torch.equal(books[0], books[2]) and not torch.equal(books[2], books[3])
    assert torch.equal(books[3], books[5]) and not torch.equal(books[5], books[6])


def test_eval_never_changes_state() -> None:
    module = gpa().train()
    module(*batch(0), None)
    before = {k: v.clone() for k, v in module.state_dict().items() if torch.is_tensor(v)}
    module.eval()
    with torch.no_grad():
        module(*batch(1), None)
        module.implied_matrix(*batch(2)[:2], None)
    after = module.state_dict()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key


def test_codebook_survives_state_dict_round_trip(tmp_path) -> None:
    module = gpa().train()
    for step in range(4):
        module(*batch(step), None)
    torch.save(module.state_dict(), tmp_path / "gpa.pt")
    restored = gpa()
    restored.load_state_dict(torch.load(tmp_path / "gpa.pt", weights_only=True))
    assert torch.equal(restored.selector.codebook, module.selector.codebook)
    assert int(restored.selector.passes) == 4 and int(restored.selector.refreshes) == 2
    module.eval()
    restored.eval()
    q, k, v = batch(9)
    torch.testing.assert_close(restored(q, k, v, None), module(q, k, v, None))
    # the schedule continues where it stopped: pass 7 refreshes in both
    module.train()
    restored.train()
    for step in range(3):
        module(*batch(10 + step), None)
        restored(*batch(10 + step), None)
    assert int(restored.selector.refreshes) == int(module.selector.refreshes) == 3
    assert torch.equal(restored.selector.codebook, module.selector.codebook)


def test_lazily_sized_codebook_loads_into_a_fresh_selector() -> None:
    """Under `attn=nystrom selector=gpa` the codebook is sized at the first call; loading still works."""
    sel = build_selector("gpa", refresh_every=2)
    module = build_attention("nystrom", head_dim=D, num_heads=H, seq_len=N, selector=sel, num_landmarks=5)
    module.train()(*batch(0), None)
    fresh = build_attention(
        "nystrom", head_dim=D, num_heads=H, seq_len=N, selector=build_selector("gpa"), num_landmarks=5
    )
    assert fresh.selector.codebook.numel() == 0
    fresh.load_state_dict(module.state_dict())
    assert torch.equal(fresh.selector.codebook, module.selector.codebook)


def test_refresh_every_one_is_plain_per_sequence_kmeans() -> None:
    q, k, _ = batch(3)
    progressive = build_selector("gpa", refresh_every=1, max_iterations=7)
    plain = KMeansSelector(KMeansConfig(max_iterations=7))
    a, b = progressive.train()(q, k, None, 5), plain(q, k, None, 5)
    torch.testing.assert_close(a.queries, b.queries)
    torch.testing.assert_close(a.keys, b.keys)


def test_landmarks_are_query_and_key_means_over_codebook_clusters() -> None:
    module = gpa().train()
    q, k, v = batch(4)
    module(q, k, v, None)
    sel = module.selector
    scale = D**-0.25
    lm = sel(q * scale, k * scale, None, sel.codebook_size)
    dist = torch.cdist(q * scale, sel.codebook.unsqueeze(0).expand(B, -1, -1, -1))
    assign = dist.argmin(-1)
    for b in range(B):
        for h in range(H):
            for c in range(sel.codebook_size):
                members = assign[b, h] == c
                if members.any():
                    torch.testing.assert_close(lm.queries[b, h, c], (q[b, h][members] * scale).mean(0))
                    torch.testing.assert_close(lm.keys[b, h, c], (k[b, h][members] * scale).mean(0))
                else:
                    assert not lm.valid[b, h, c]


def test_codebook_checkpoints_with_the_whole_model(tmp_path) -> None:
    kwargs = dict(
        vocab_size=20,
        seq_len=N,
        num_classes=3,
        dual=False,
        model={"dim": 16, "depth": 2, "num_heads": H, "head_dim": D, "ffn_dim": 32, "dropout": 0.0},
        attn={"name": "gpa", "num_landmarks": "log2", "conv_kernel": 0},
        selector={"name": "gpa", "refresh_every": 2, "max_iterations": 3},
    )
    model = build_classifier(**kwargs).train()
    ids = torch.randint(0, 20, (B, N), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 20:] = False
    for _ in range(3):
        model({"input_ids": ids, "mask": mask}).sum().backward()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    clone = build_classifier(**kwargs)
    clone.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    books = [k for k in model.state_dict() if k.endswith("selector.codebook")]
    assert len(books) == 2, "one codebook per layer"
    for key in books:
        assert torch.equal(clone.state_dict()[key], model.state_dict()[key])
        assert model.state_dict()[key].shape == (H, 5, D)
    model.eval()
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone({"input_ids": ids, "mask": mask}), model({"input_ids": ids, "mask": mask}))
