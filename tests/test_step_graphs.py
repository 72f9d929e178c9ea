"""Graphed training steps on the CPU, with torch.cuda's streams and graphs faked: a fake capture records the step
and each replay runs it again, so what is tested is everything but the CUDA graph itself: the warm-up, the sync
check, the step gathered at the device's step counter, the keys (which runs take part, soft labels), the length
groups sized for a graph, the whole update inside the step. For every cached method a batched, graphed run equals
the same group trained eagerly bit for bit and each run trained alone (eagerly, with the CPU's length groups) to
float rounding; an injected fp16 overflow skips exactly the run that overflowed; a graphed step dispatches nothing
on the host besides its replay. What a real GPU would refuse and the fake's capture cannot see is counted or
simulated: every registered method's replayed steps (each key, a run sitting out) upload nothing and read nothing
back; every key's last warm-up is checked; a class-buffer rebuild drops the graphs even at the same addresses; a
capture or first replay that raises falls back to eager steps with one warning and the same numbers; the capture
lets other threads work. The replays themselves run in benchmarks/gpu_check.py."""

import contextlib

import pytest
import torch

from atlas_fast.atlas.schedules import Alternating, OneHot
from atlas_fast.clip.text_encoder import graph_length_groups
from atlas_fast.engine.loop import TrainingRuns, train_runs
from atlas_fast.engine.step import RunState
from atlas_fast.methods.config import OptimRecipe
from atlas_fast.methods.registry import method_class
from helpers import fake_cuda_streams

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "bird", "great white shark", "red fox"]
SIZES = (16, 8, 11)  # batch 4: steps [4, 4, 4] x2, then [4, 0, 3] (partial: eager), then [4, 0, 0]
BATCH = 4


class Rows:
    """Cached features of one run held as rows on the device, one view (what CachedViews offers)."""

    def __init__(self, features: torch.Tensor) -> None:
        self.features = features

    def device_rows(self):
        return self.features, 1

    def batches(self, epoch, order, batch_size):
        for index in order.split(batch_size):
            yield self.features[index], index


@pytest.fixture
def fake_graphs(monkeypatch):
    """torch.cuda's streams faked, graphs "captured" without running and replayed by running the step again."""
    from atlas_fast.engine import graphs

    fake_cuda_streams(monkeypatch)
    record = {"captures": 0, "replays": 0, "syncs": [], "before": [], "after": []}

    def capture(body, stream, pool=None):
        record["captures"] += 1

        def replay():
            record["replays"] += 1
            for hook in record["before"]:
                hook()
            body()
            for hook in record["after"]:
                hook()
        return replay, None

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(graphs, "host_syncs", lambda function: (function(), list(record["syncs"])))
    return record


def _group(tiny, name, runs=3, seed=0, sizes=SIZES, schedules=None):
    """A method of ``runs`` runs and their states: different sizes, schedules, soft labels."""
    entry = method_class(name)
    torch.manual_seed(seed)
    method = entry.build(tiny, CLASSES, entry.config_class(ctx_init="a photo of a"), runs)
    generator = torch.Generator().manual_seed(seed)
    states = []
    schedules = schedules or [OneHot(), Alternating(2), Alternating(1)]
    for r in range(runs):
        n = sizes[r]
        features = torch.randn(n, tiny.embed_dim, generator=generator)
        labels = torch.randint(len(CLASSES), (n,), generator=generator)
        soft = torch.softmax(torch.randn(n, len(CLASSES), generator=generator), dim=-1) if r else None
        states.append(RunState(Rows(features), labels, soft, schedules[r], seed=r + 1, device=torch.device("cpu")))
    return method, states


def _single(tiny, name, grouped, r):
    """Run r alone: a one-run method holding run r's initial tensors, and a state over the same data."""
    entry = method_class(name)
    method = entry.build(tiny, CLASSES, entry.config_class(ctx_init="a photo of a"))
    method.load_checkpoint_state({k: v[r:r + 1] for k, v in grouped.state_for_checkpoint().items()})
    return method


def _train(method, states, epochs=5, graph_steps=False, amp=False):
    recipe = OptimRecipe(epochs=epochs, batch_size=BATCH, lr=0.05)
    return train_runs(TrainingRuns(method, states), recipe, torch.device("cpu"), amp, progress=False,
                      graph_steps=graph_steps)


def _fresh(states):
    """The same runs again (new generators, schedules reset by the loop)."""
    return [RunState(s.train_inputs, s.labels, s.soft_rows, type(s.schedule)(**vars(s.schedule)),
                     seed=r + 1, device=torch.device("cpu")) for r, s in enumerate(states)]


CACHED = ["coop", "cocoop", "kgcoop", "dept-coop", "dept-cocoop", "dept-kgcoop"]


@pytest.mark.parametrize("name", CACHED)
def test_graphed_steps_equal_eager_steps_and_runs_trained_alone(tiny, fake_graphs, name):
    method, states = _group(tiny, name)
    initial = method.state_for_checkpoint()
    graphed_logs = _train(method, states, graph_steps=True)
    assert fake_graphs["replays"] > 0 and sum(e["graphed_steps"] for e in graphed_logs[0]) == fake_graphs["replays"]
    graphed = method.state_for_checkpoint()

    # the same group eagerly, with the graph's length groups: bit for bit
    eager, _ = _group(tiny, name)
    eager.load_checkpoint_state(initial)
    with graph_length_groups():
        eager_logs = _train(eager, _fresh(states))
    for key, tensor in eager.state_for_checkpoint().items():
        assert torch.equal(graphed[key], tensor), key
    assert [[e["loss"] for e in log] for log in graphed_logs] == [[e["loss"] for e in log] for log in eager_logs]

    # each run alone, eagerly, with the CPU's length groups: to float rounding
    for r, state in enumerate(_fresh(states)):
        single = _single(tiny, name, method, r)
        single.load_checkpoint_state({k: v[r:r + 1] for k, v in initial.items()})
        (log,) = _train(single, [state])
        for key, tensor in single.state_for_checkpoint().items():
            torch.testing.assert_close(graphed[key][r:r + 1], tensor, atol=1e-5, rtol=1.3e-6, msg=key)
        assert [e["loss"] for e in graphed_logs[r]] == pytest.approx([e["loss"] for e in log], rel=1e-4, abs=1e-5)


class _Overflow(torch.autograd.Function):
    """Identity forward; backward multiplies each run's gradient by ``factors`` (inf: an fp16 overflow)."""

    @staticmethod
    def forward(ctx, losses, factors):
        ctx.save_for_backward(factors)
        return losses.view_as(losses)

    @staticmethod
    def backward(ctx, grad):
        (factors,) = ctx.saved_tensors
        return grad * factors, None


def _inject_overflow(method, run, at_steps):
    """Make run ``run``'s gradients overflow in the steps ``at_steps`` (counted over the method's loss calls)."""
    original, calls = method.training_loss, [0]

    def training_loss(inputs, labels, criterion):
        losses = original(inputs, labels, criterion).reshape(-1)  # a lone run's loss may be a scalar
        step, calls[0] = calls[0], calls[0] + 1
        if step not in at_steps:
            return losses
        # a fill, not ``factors[run] = inf`` (which makes a tensor of the host's number: an upload in the step)
        factors = torch.ones_like(losses).masked_fill(torch.arange(len(losses)) == run, float("inf"))
        return _Overflow.apply(losses, factors)

    method.training_loss = training_loss


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphed"])
def test_an_injected_overflow_skips_exactly_the_run_that_overflowed(tiny, fake_graphs, graphed):
    """Under AMP (fp16 autocast on the CPU), run 1's gradients overflow in two steps (one of them replayed when
    graphed): the other runs end bit for bit as without the overflow, and run 1 as run 1 alone with the same
    overflows (its own scaler skipped those steps and halved its scale)."""
    # group steps 1 and 9 (epoch 2, step 1: replayed when graphed) are run 1's own steps 1 and 5 (2 per epoch)
    name, overflow_at, alone_at = "dept-coop", {1, 9}, {1, 5}
    method, states = _group(tiny, name)
    initial = method.state_for_checkpoint()
    _inject_overflow(method, 1, overflow_at)
    logs = _train(method, states, epochs=3, graph_steps=graphed, amp=True)
    assert (fake_graphs["replays"] > 0) == graphed
    hit = method.state_for_checkpoint()

    clean, _ = _group(tiny, name)
    clean.load_checkpoint_state(initial)
    _train(clean, _fresh(states), epochs=3, graph_steps=graphed, amp=True)
    without = clean.state_for_checkpoint()
    for key in hit:
        assert torch.equal(hit[key][[0, 2]], without[key][[0, 2]]), key
    assert any(not torch.equal(hit[key][1], without[key][1]) for key in hit)

    single = _single(tiny, name, method, 1)
    single.load_checkpoint_state({k: v[1:2] for k, v in initial.items()})
    _inject_overflow(single, 0, alone_at)
    (alone,) = _train(single, [_fresh(states)[1]], epochs=3, graph_steps=graphed, amp=True)
    for key, tensor in single.state_for_checkpoint().items():
        torch.testing.assert_close(hit[key][1:2], tensor, atol=2e-4, rtol=1e-3, msg=key)
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in logs[1])


def test_warm_up_check_capture_replay_and_recapture(tiny, fake_graphs):
    from atlas_fast.engine.graphs import GRAPH_WARMUP_STEPS

    method, states = _group(tiny, "coop", runs=1)
    logs = _train(method, states[:1], epochs=3, graph_steps=True)
    # 4 full steps per epoch, one key (one-hot every epoch): 2 warm-ups, then a capture and 10 replays
    assert fake_graphs["captures"] == 1 and fake_graphs["replays"] == 3 * 4 - GRAPH_WARMUP_STEPS
    assert [e["graphed_steps"] for e in logs[0]] == [2, 4, 4]

    # new class buffers (what a per-epoch evaluation on another class set leaves) drop the graphs: warm up again
    method, states = _group(tiny, "coop", runs=1)

    def move(epoch):
        method.set_classnames(CLASSES)
        return [{}]

    fake_graphs["captures"] = fake_graphs["replays"] = 0
    recipe = OptimRecipe(epochs=3, batch_size=BATCH, lr=0.05)
    logs = train_runs(TrainingRuns(method, states[:1], move), recipe, torch.device("cpu"), False, progress=False,
                      graph_steps=True)
    assert fake_graphs["captures"] == 3 and [e["graphed_steps"] for e in logs[0]] == [2, 2, 2]


def test_steps_that_sync_with_the_host_stay_eager(tiny, fake_graphs):
    fake_graphs["syncs"].append("called a synchronizing CUDA operation")
    method, states = _group(tiny, "coop", runs=1)
    with pytest.warns(UserWarning, match=r"graph_steps: coop, step run 0 of 1 \(one-hot\): its step synchronises "
                                         r"with the host .*: called a synchronizing CUDA operation"):
        logs = _train(method, states[:1], epochs=2, graph_steps=True)
    assert fake_graphs["captures"] == 0 and [e["graphed_steps"] for e in logs[0]] == [0, 0]


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_a_graphed_step_is_its_replay_and_reads_nothing_back(tiny, fake_graphs, monkeypatch, amp):
    """Between two replays of one epoch with no eager step between them the loop dispatches no operator on the host;
    the replayed step (the whole step: batch, loss, backward, update, loss sums) contains no operator that reads a
    value back to the host."""
    from atlas_fast.engine import step as step_module
    from atlas_fast.engine.graphs import DispatchCount

    method, states = _group(tiny, "dept-kgcoop", runs=2, sizes=(16, 16), schedules=[OneHot(), Alternating(1)])
    outside, inside = DispatchCount(), DispatchCount()
    events, state = [], {"eager": 0, "epoch": 0}

    def before():
        events.append((outside.total, state["eager"], state["epoch"]))
        outside.paused = True
        inside.__enter__()

    def after():
        inside.__exit__(None, None, None)
        outside.paused = False

    fake_graphs["before"].append(before)
    fake_graphs["after"].append(after)
    call = step_module.TrainStep.__call__

    def counted(self, *args, **kwargs):
        if not outside.paused:
            state["eager"] += 1
        return call(self, *args, **kwargs)

    def epoch_end(epoch):
        state["epoch"] += 1
        return [{}, {}]

    monkeypatch.setattr(step_module.TrainStep, "__call__", counted)
    recipe = OptimRecipe(epochs=4, batch_size=BATCH, lr=0.05)
    with outside:
        train_runs(TrainingRuns(method, states, epoch_end), recipe, torch.device("cpu"), amp, progress=False,
                   graph_steps=True)
    consecutive = [b[0] - a[0] for a, b in zip(events, events[1:]) if a[1:] == b[1:]]
    assert len(consecutive) >= 6 and set(consecutive) == {0}
    assert inside.read_backs == 0 and inside.uploads == 0 and inside.total > 100


def test_rows_on_the_current_cuda_device_are_on_cuda(monkeypatch):
    """Cached views moved ``.to("cuda")`` sit on ``cuda:0``; the run's device is ``cuda``: the step gathers there."""
    from atlas_fast.engine.step import same_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda")
    assert same_device(torch.device("cuda", 0), cuda) and same_device(torch.device("cuda", 0), torch.device("cuda:0"))
    assert not same_device(torch.device("cuda", 1), cuda) and not same_device(torch.device("cpu"), cuda)
    assert same_device(torch.device("cpu"), torch.device("cpu"))


class PixelRows:
    """Pixels and the frozen features of the same views, served batch by batch (no rows on the device: a pixel
    group's batches come from its loader and are copied into a graph's buffers)."""

    def __init__(self, pixels: torch.Tensor, frozen: torch.Tensor) -> None:
        self.pixels, self.frozen = pixels, frozen

    def batches(self, epoch, order, batch_size):
        from atlas_fast.engine.feed import PixelBatch

        for index in order.split(batch_size):
            yield PixelBatch(self.pixels[index], self.frozen[index]), index


def test_a_pixel_group_replays_its_steps_from_the_graphs_buffers(tiny, fake_graphs):
    """Two PromptSRC runs as one module, pixels and cached frozen features stacked per run: the graphed steps copy
    each step's pixel batch into the graph's buffers and equal the same steps run eagerly, bit for bit."""
    from atlas_fast.methods.promptsrc import PromptSRCConfig

    entry = method_class("promptsrc")
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 3, 32, 32, generator=generator), torch.randn(8, tiny.embed_dim, generator=generator),
             torch.randint(3, (8,), generator=generator)) for _ in range(2)]

    def trained(graph_steps):
        torch.manual_seed(0)
        method = entry.build(tiny, CLASSES[:3], PromptSRCConfig(depth_text=2, depth_vision=2), runs=2)
        states = [RunState(PixelRows(pixels, frozen), labels, None, OneHot(), seed=r + 1,
                           device=torch.device("cpu")) for r, (pixels, frozen, labels) in enumerate(data)]
        with graph_length_groups():
            logs = _train(method, states, epochs=3, graph_steps=graph_steps)
        return method.state_for_checkpoint(), logs

    graphed, logs = trained(True)
    assert fake_graphs["replays"] == 4 and [e["graphed_steps"] for e in logs[0]] == [0, 2, 2]
    eager, _ = trained(False)
    assert all(torch.equal(graphed[name], eager[name]) for name in eager)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
@pytest.mark.parametrize("name", ["tcp", "clip-lora-text"])
def test_adam_recipes_replay_their_steps_and_read_nothing_back(tiny, fake_graphs, name, amp):
    """TCP's Adam and CLIP-LoRA's AdamW with a cosine over 10 optimiser steps (it stops inside epoch 2): graphed
    steps equal the eager steps with the graph's length groups bit for bit, the per-step lr reaches the replays
    (device scalars filled before each step), and a replayed step reads nothing back to the host."""
    import dataclasses

    from atlas_fast.engine.graphs import DispatchCount
    from atlas_fast.pricing.units import method_config_for

    entry = method_class(name)
    _, own = entry.recipe_function("paper", "base2new", 16, "ImageNet")
    recipe = dataclasses.replace(own, epochs=3, batch_size=BATCH, lr=0.01, min_lr=0.0)
    if own.iterations is not None:
        recipe = dataclasses.replace(recipe, iterations=10).for_training_images(16)
    config = method_config_for(name, None, tiny)
    features = torch.randn(16, tiny.embed_dim, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(16) % len(CLASSES)
    inside = DispatchCount()
    fake_graphs["before"].append(inside.__enter__)
    fake_graphs["after"].append(lambda: inside.__exit__(None, None, None))
    states = []
    for graphed in (True, False):
        torch.manual_seed(0)
        method = entry.build(tiny, CLASSES, config)
        state = RunState(Rows(features), labels, None, OneHot(), seed=1, device=torch.device("cpu"))
        with graph_length_groups() if not graphed else contextlib.nullcontext():
            logs = train_runs(TrainingRuns(method, [state]), recipe, torch.device("cpu"), amp, progress=False,
                              graph_steps=graphed)
        states.append(method.state_for_checkpoint())
        if graphed:
            replayed = sum(e["graphed_steps"] for e in logs[0])
            steps = recipe.iterations or 3 * 4  # TCP: 3 epochs of 4 steps
            assert replayed == fake_graphs["replays"] == steps - 2 and inside.read_backs == 0 and inside.total > 50
            assert inside.uploads == 0, inside.host_traffic()
    assert len(logs[0]) == 3 and all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def _runnable_here(config, folder):
    """Options a method's paper config needs to build on the tiny model without downloads: a tiny random teacher
    (KDPL, PromptKD, its prompts at their initialisation) and class descriptions (CoPrompt)."""
    import dataclasses
    import json

    fields = {field.name for field in dataclasses.fields(config)}
    options = {}
    if "teacher" in fields:
        options.update(teacher="atlas-tiny-teacher", teacher_pretrained="none")
    if "teacher_prompts" in fields:
        options["teacher_prompts"] = "none"
    options.update({depth: 2 for depth in ("teacher_depth_text", "teacher_depth_vision") if depth in fields})
    if "descriptions" in fields:
        path = folder / "descriptions.json"
        path.write_text(json.dumps({name: [f"a photo of a {name}, description {k}." for k in range(3)]
                                    for name in CLASSES}))
        options["descriptions"] = str(path)
    return options


#: The cases of the default suite (the rest run with ``-m slow``): one of each path that uploaded before (CLIP-LoRA's
#: temperature, PromptSRC's and DePT's padding masks for a run that sits out) and CoOp.
DEFAULT_UPLOAD_CASES = ("coop", "clip-lora-text", "promptsrc", "dept-coop-onehot")


def _training_methods():
    """Every registered method that trains (from the registry), and DePT once more with its head's text rows on
    one-hot targets (its own cross-entropy, not the criterion's: a path of its own for a run that sits out)."""
    from atlas_fast.methods.registry import METHODS, method_class

    method_class("coop")  # the registry is filled by importing the methods
    cases = [(name, {}) for name, entry in sorted(METHODS.items()) if entry.learns]
    cases.append(("dept-coop", {"head_text_targets": "onehot"}))
    params = []
    for name, options in cases:
        case = name + "".join(f"-{value}" for value in options.values())
        marks = () if case in DEFAULT_UPLOAD_CASES else (pytest.mark.slow,)
        params.append(pytest.param(name, options, id=case, marks=marks))
    return params


@pytest.mark.parametrize("name,options", _training_methods())
def test_every_methods_replayed_step_uploads_nothing_and_reads_nothing_back(tiny, fake_graphs, tmp_path, name,
                                                                           options):
    """Each method's own recipe (SGD, Adam, AdamW), with two runs of unequal sizes where it batches runs (steps
    [B, B] then [B, 0]: run 1 sits the second out, a key of its own): every key is captured and replayed, and the
    replayed steps make no tensor of host data (``torch.tensor``, ``as_tensor``, a list index: an upload on a GPU,
    which a graph would replay with the first step's values) and read nothing back. On a GPU both fail a capture or,
    worse, replay stale values; the fake's capture cannot see them, so they are counted here."""
    import dataclasses

    from atlas_fast.engine.graphs import DispatchCount
    from atlas_fast.engine.group import batches_runs
    from atlas_fast.pricing.units import _SyntheticInputs, _training_inputs, method_config_for

    entry = method_class(name)
    runs = 2 if batches_runs(entry) else 1
    config = method_config_for(name, None, tiny)
    config = dataclasses.replace(config, **{**_runnable_here(config, tmp_path), **options})
    _, own = entry.recipe_function("paper", "base2new", 16, "ImageNet")
    batch, epochs = 2, 3
    recipe = dataclasses.replace(own, epochs=epochs, batch_size=batch, warmup_epochs=min(own.warmup_epochs, 1))
    if own.iterations is not None:
        recipe = dataclasses.replace(recipe, iterations=100)
    inside = DispatchCount()
    fake_graphs["before"].append(inside.__enter__)
    fake_graphs["after"].append(lambda: inside.__exit__(None, None, None))
    torch.manual_seed(0)
    method = entry.build(tiny, CLASSES, config, runs)
    states = []
    for r in range(runs):
        items = 2 * batch if r == 0 else batch
        inputs = _training_inputs(entry, tiny, items, torch.device("cpu"), config)
        labels = torch.arange(items) % len(CLASSES)
        states.append(RunState(_SyntheticInputs(inputs), labels, None, OneHot(), seed=r + 1,
                               device=torch.device("cpu")))
    logs = train_runs(TrainingRuns(method, states), recipe, torch.device("cpu"), False, progress=False,
                      graph_steps=True)
    keys = 2 if runs == 2 else 1  # [B, B] and [B, 0]; a lone run's [B]
    assert fake_graphs["captures"] == keys and fake_graphs["replays"] >= keys, (name, logs[0])
    assert sum(e["graphed_steps"] for e in logs[0]) == fake_graphs["replays"]
    assert inside.total > 50
    assert (inside.uploads, inside.read_backs) == (0, 0), inside.host_traffic()


def _upload_when_a_run_sits_out(method):
    """Make ``method``'s step upload a host number in the steps where a run sits out (as PromptSRC's and DePT's
    padding masks did), and in no other."""
    original = method.training_loss

    def training_loss(inputs, labels, criterion):
        loss = original(inputs, labels, criterion)
        if 0 in criterion.sizes:
            loss = loss * torch.tensor(1.0)  # an upload on a GPU
        return loss

    method.training_loss = training_loss


def test_every_keys_last_warm_up_is_checked_for_host_traffic(tiny, fake_graphs):
    """Host traffic only in the steps where a run sits out (the group's second key): its last warm-up finds it,
    and the group falls back to eager steps with one warning naming the method and that key, before any capture of
    it; the record's log names the fallback."""
    method, states = _group(tiny, "coop", runs=2, sizes=(8, 4), schedules=[OneHot(), OneHot()])
    _upload_when_a_run_sits_out(method)
    with pytest.warns(UserWarning) as caught:
        logs = _train(method, states, epochs=3, graph_steps=True)
    messages = [str(w.message) for w in caught if "graph_steps" in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("graph_steps: coop, step run 0 of 2 (one-hot): its step synchronises with the "
                                  "host or copies to or from it: 1 upload(s) from the host (lift_fresh)")
    assert fake_graphs["replays"] == 0
    fallbacks = [e.get("graph_fallback") for e in logs[0]]
    assert fallbacks[1] is not None and fallbacks[0] is None and fallbacks[2] is None
    assert [e["graphed_steps"] + e["eager_steps"] for e in logs[0]] == [2, 2, 2]


def _same_addresses(method):
    """``method.set_classnames`` whose new class buffers land at the addresses of the old ones (as a caching
    allocator may hand them back): each new buffer is moved into its predecessor's storage."""
    rebuild = method.set_classnames

    def set_classnames(classnames):
        old = dict(method.named_buffers())
        rebuild(classnames)
        for name, new in method.named_buffers():
            before = old.get(name)
            if before is not None and before is not new and before.shape == new.shape and before.dtype == new.dtype:
                values = new.clone()
                new.set_(before.untyped_storage(), before.storage_offset(), before.shape, before.stride())
                new.copy_(values)
        assert {n: b.data_ptr() for n, b in method.named_buffers()} == {n: b.data_ptr() for n, b in old.items()}

    method.set_classnames = set_classnames


@pytest.mark.parametrize("name", ["coop", "dept-kgcoop"])
def test_a_class_buffer_rebuild_drops_the_graphs_even_at_the_same_addresses(tiny, fake_graphs, name):
    """A per-epoch evaluation rebuilds the class buffers (and the text layouts cached on them, which a captured step
    reads); the new buffers land at the old addresses: the graphs are still dropped, warmed up and captured again
    (each rebuild gives the method, or DePT's base, a new class version)."""
    method, states = _group(tiny, name, runs=1)
    _same_addresses(method.base if name.startswith("dept") else method)
    versions = []

    def rebuild(epoch):
        versions.append(tuple(getattr(m, "class_version", 0) for m in method.modules()))
        (method.base if name.startswith("dept") else method).set_classnames(CLASSES)
        return [{}]

    recipe = OptimRecipe(epochs=3, batch_size=BATCH, lr=0.05)
    logs = train_runs(TrainingRuns(method, states[:1], rebuild), recipe, torch.device("cpu"), False, progress=False,
                      graph_steps=True)
    assert fake_graphs["captures"] == 3 and [e["graphed_steps"] for e in logs[0]] == [2, 2, 2]
    assert len(set(versions)) == 3


def _fails_to_capture(monkeypatch, message="operation not permitted when stream is capturing"):
    from atlas_fast.engine import graphs

    def capture(body, stream, pool=None):  # a real capture that fails has run no kernel
        raise RuntimeError(f"CUDA error: {message}\nCUDA kernel errors might be asynchronously reported")

    monkeypatch.setattr(graphs, "capture", capture)


def _fails_at_first_replay(monkeypatch, fake_graphs):
    from atlas_fast.engine import graphs

    def capture(body, stream, pool=None):
        fake_graphs["captures"] += 1

        def replay():  # a graph that cannot launch fails before any of its kernels runs
            raise RuntimeError("CUDA error: invalid device function")
        return replay, None

    monkeypatch.setattr(graphs, "capture", capture)


@pytest.mark.parametrize("failure", ["capture", "first replay"])
def test_a_failed_capture_or_first_replay_falls_back_to_eager_steps_with_one_warning(tiny, fake_graphs,
                                                                                     monkeypatch, failure):
    """The group trains on eagerly: one warning naming the method and the key, the numbers of the same group
    trained eagerly bit for bit, and the fallback in the log (and so in the record)."""
    method, states = _group(tiny, "coop")
    initial = method.state_for_checkpoint()
    if failure == "capture":
        _fails_to_capture(monkeypatch)
        reason = "capturing its step failed: CUDA error: operation not permitted when stream is capturing"
    else:
        _fails_at_first_replay(monkeypatch, fake_graphs)
        reason = "the first replay of its graph failed: CUDA error: invalid device function"
    with pytest.warns(UserWarning) as caught:
        logs = _train(method, states, graph_steps=True)
    messages = [str(w.message) for w in caught if "graph_steps" in str(w.message)]
    assert messages == [f"graph_steps: coop, step runs 0, 1, 2 of 3 (soft labels: 2): {reason}; a CUDA graph "
                        f"cannot replay that, so these runs train eagerly from here on (the same numbers, without "
                        f"the graphs' speed)."]
    assert fake_graphs["replays"] == 0 and all(e["graphed_steps"] == 0 for log in logs for e in log)
    # epoch 2 holds the third step of the first key (the keys change with the epochs' soft labels)
    assert [e.get("graph_fallback") for e in logs[0]] == [
        None, None, f"coop, step runs 0, 1, 2 of 3 (soft labels: 2): {reason}", None, None]

    from atlas_fast.engine.record import graph_summary
    summary = graph_summary(logs[0])
    assert summary["on"] and summary["graphed_steps"] == 0 and summary["eager_steps"] == 5 * 4
    assert summary["fallback"].startswith("coop, step runs 0, 1, 2 of 3")

    eager, _ = _group(tiny, "coop")
    eager.load_checkpoint_state(initial)
    with graph_length_groups():
        eager_logs = _train(eager, _fresh(states))
    for key, tensor in eager.state_for_checkpoint().items():
        assert torch.equal(method.state_for_checkpoint()[key], tensor), key
    assert [[e["loss"] for e in log] for log in logs] == [[e["loss"] for e in log] for log in eager_logs]


def test_capture_lets_other_threads_work_and_checks_liveness_on_request(monkeypatch):
    """A capture fails only on what its own thread does (the pixel loader's pin-memory thread allocates pinned
    memory meanwhile: under torch's default mode that fails the capture, and the loader's next batch raises the
    error again); ATLAS_FAST_GRAPH_DEBUG=1 adds torch's check that every tensor a graph reads is still alive at each
    replay. Both are options of the installed torch's ``torch.cuda.graph``."""
    import inspect

    from atlas_fast.engine import graphs

    parameters = inspect.signature(torch.cuda.graph.__init__).parameters
    assert "capture_error_mode" in parameters and "check_input_liveness" in parameters
    options = {}

    class Graph:
        def replay(self):
            pass

    class Capturing:
        def __init__(self, graph, **kwargs):
            options.clear()
            options.update(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capturing)
    monkeypatch.delenv("ATLAS_FAST_GRAPH_DEBUG", raising=False)
    _, outputs = graphs.capture(lambda: "out", stream="stream", pool="pool")
    assert outputs == "out" and options["capture_error_mode"] == "thread_local"
    assert not options.get("check_input_liveness", False)
    monkeypatch.setenv("ATLAS_FAST_GRAPH_DEBUG", "1")
    graphs.capture(lambda: None, stream="stream", pool="pool")
    assert options["check_input_liveness"] is True and options["capture_error_mode"] == "thread_local"


def test_a_rebuild_between_a_keys_warm_ups_starts_its_warm_up_again(tiny, fake_graphs, recwarn):
    """One full step per epoch and new class buffers after every epoch (a per-epoch evaluation): the first step
    after a rebuild builds the text layouts of the new buffers (from host data, as it may: it is a warm-up), so it
    must count as a first warm-up again, never as a key's checked last one (which would refuse graphs for host
    traffic that no replay has)."""
    method, states = _group(tiny, "coop", runs=1, sizes=(BATCH + 1,))

    def rebuild(epoch):
        method.set_classnames(CLASSES)
        return [{}]

    recipe = OptimRecipe(epochs=3, batch_size=BATCH, lr=0.05)
    logs = train_runs(TrainingRuns(method, states[:1], rebuild), recipe, torch.device("cpu"), False, progress=False,
                      graph_steps=True)
    assert not [str(w.message) for w in recwarn if "graph_steps" in str(w.message)]
    assert [e.get("graph_fallback") for e in logs[0]] == [None] * 3
    assert [(e["graphed_steps"], e["eager_steps"]) for e in logs[0]] == [(0, 2)] * 3


def test_the_text_layouts_a_graph_reads_stay_alive_while_it_lives(tiny, fake_graphs):
    """The class-index, mask and pooled-row tensors of the packed text layout are cached on the EOT buffer, in a
    cache that clears itself past 16 variants; a captured step reads them at their addresses, so the graphs hold
    them: emptied before every replay, the layouts captured first are still alive."""
    import weakref

    method, states = _group(tiny, "coop", runs=1)
    captured = []

    def clear_layouts():  # what the cache's bound does when a 17th variant comes
        layouts = method.eot_index._packed_layouts
        if not captured:
            captured.extend(weakref.ref(t) for layout in layouts.values()
                            for t in [*layout.indices, *layout.masks, layout.pooled])
        layouts.clear()  # freed at once where nothing else holds them (no cycles)
        assert captured and all(ref() is not None for ref in captured)

    fake_graphs["before"].append(clear_layouts)
    logs = _train(method, states[:1], epochs=2, graph_steps=True)
    assert fake_graphs["replays"] == sum(e["graphed_steps"] for e in logs[0]) == 6
