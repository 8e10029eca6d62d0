"""The scheduler alone: interactive before batch, FCFS within a class, aging against starvation,
the token budget cutting prompts into chunks, at most max_loras adapters per step when set,
loading ahead, and a bounded wait for an adapter that finds no room."""

from serving.engine.kv_cache import BlockManager
from serving.engine.request import GenerateRequest, Priority
from serving.engine.scheduler import Scheduler, SchedulerConfig
from serving.engine.sequence import Sequence


def seq(name, n=8, priority=Priority.INTERACTIVE, adapter=None):
    request = GenerateRequest(name, tuple(range(1, n + 1)), adapter=adapter, priority=priority)
    return Sequence(request=request, token_ids=list(request.prompt_token_ids), adapter_key=adapter)


class Gate:
    """An adapter gate from a `ready` rule; an adapter not ready is loading; load-aheads kept."""

    def __init__(self, ready=lambda v: True):
        self.ready, self.ahead = ready, []

    def short_of_room(self, version):
        return False

    def load_ahead(self, versions):
        self.ahead.append(versions)


def scheduler(ready=lambda v: True, **config):
    return Scheduler(SchedulerConfig(**config), BlockManager(64, 4), Gate(ready))


def admitted(s):
    return [x.seq.request.request_id for x in s.schedule().scheduled]


def test_interactive_before_batch_and_fcfs_within_a_class():
    s = scheduler(max_num_seqs=2)
    for x in (
        seq("b1", priority=Priority.BATCH),
        seq("i1"),
        seq("b2", priority=Priority.BATCH),
        seq("i2"),
    ):
        s.add(x)
    assert admitted(s) == ["i1", "i2"]


def test_a_waiting_batch_request_ages_past_new_interactive_ones():
    s = scheduler(max_num_seqs=1, aging_steps=2)
    s.add(seq("batch", priority=Priority.BATCH))
    order = []
    for i in range(6):  # a new interactive request arrives every step; one runs at a time
        s.add(seq(f"i{i}"))
        step = s.schedule()
        order += [x.request.request_id for x in step.admitted]
        for x in step.scheduled:
            s.remove(x.seq)  # finished
    assert "batch" in order  # not starved


def test_token_budget_cuts_a_prompt_into_chunks():
    s = scheduler(max_num_batched_tokens=5)
    long = seq("long", n=12)
    s.add(long)
    chunks = []
    for _ in range(3):
        (item,) = s.schedule().scheduled
        chunks.append(item.num_new_tokens)
        s.blocks.mark_computed(long, item.num_new_tokens)
    assert chunks == [5, 5, 2]


def test_at_most_max_loras_adapters_and_unready_adapters_wait_without_blocking():
    s = scheduler(ready=lambda v: v != "slow", max_loras=2)
    for name, adapter in (("a", "v1"), ("b", "slow"), ("c", "v2"), ("d", "v3"), ("e", None)):
        s.add(seq(name, adapter=adapter))
    assert admitted(s) == ["a", "c", "e"]  # b's adapter is loading, d would be a third adapter


def test_a_sequence_scheduled_this_step_is_never_the_one_preempted():
    """Two sequences of equal rank, room for one to grow: the second must give way, not the first
    (which is already in this step's batch and would run without its blocks)."""
    s = Scheduler(SchedulerConfig(), BlockManager(5, 4), Gate())
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    s.schedule()  # both admitted with 2 full blocks each; 1 block left
    for x in (a, b):
        s.blocks.mark_computed(x, 8)
        x.token_ids.append(99)  # each sampled a token, which needs a third block
    step = s.schedule()
    assert [x.seq for x in step.scheduled] == [a] and step.preempted == [b]
    assert a.block_table and len(a.block_table) == 3


def test_running_batch_items_yield_the_step_that_admits_an_interactive_request():
    s = scheduler()
    for name in ("b1", "b2"):
        s.add(seq(name, priority=Priority.BATCH))
    assert admitted(s) == ["b1", "b2"]
    for x in list(s.running):
        s.blocks.mark_computed(x, x.num_uncomputed)  # prefilled: each now decodes a token
        x.token_ids.append(1)
    s.add(seq("i1"))
    assert admitted(s) == ["i1"]  # its prefill alone: its first token waits for nothing else
    s.blocks.mark_computed(s.running[-1], s.running[-1].num_uncomputed)
    s.running[-1].token_ids.append(1)
    assert sorted(admitted(s)) == ["b1", "b2", "i1"]  # and then everything decodes again


def test_batch_items_do_not_yield_to_a_request_that_cannot_be_admitted_now():
    s = scheduler(ready=lambda version: version != "cold@1")
    s.add(seq("b1", priority=Priority.BATCH))
    assert admitted(s) == ["b1"]
    s.blocks.mark_computed(s.running[0], s.running[0].num_uncomputed)
    s.running[0].token_ids.append(1)
    s.add(seq("i1", adapter="cold@1"))  # its adapter is still loading
    assert admitted(s) == ["b1"]


def test_batch_items_do_not_yield_to_a_request_whose_adapter_is_over_max_loras():
    """b1 holds the one adapter a step may have; i1's adapter, resident, must wait for it.
    Were b1 to yield to i1, which _admit then turns away, neither would ever run again."""
    s = scheduler(max_loras=1)
    s.add(seq("b1", priority=Priority.BATCH, adapter="a@1"))
    assert admitted(s) == ["b1"]
    s.blocks.mark_computed(s.running[0], s.running[0].num_uncomputed)
    s.running[0].token_ids.append(1)
    s.add(seq("i1", adapter="b@1"))
    s.add(seq("i2"))  # the base model fits beside a@1: b1 yields the step to it
    assert admitted(s) == ["i2"]
    assert sorted(admitted(s)) == ["b1", "i2"]  # i1 waits for a@1 to leave, b1 goes on
    s.remove(s.running[0])  # b1 ends
    assert "i1" in admitted(s)


def test_aged_batch_items_no_longer_yield():
    s = scheduler(aging_steps=1)
    s.add(seq("b1", priority=Priority.BATCH))
    assert admitted(s) == ["b1"]
    s.blocks.mark_computed(s.running[0], s.running[0].num_uncomputed)
    s.running[0].token_ids.append(1)
    s.schedule()  # a step later b1 has aged into the interactive class
    s.add(seq("i1"))
    assert sorted(admitted(s)) == ["b1", "i1"]


def test_no_count_cap_by_default():
    s = scheduler()
    for i in range(20):
        s.add(seq(f"r{i}", adapter=f"v{i}"))
    assert len(admitted(s)) == 20  # the slab's room decides, through the gate


def test_the_next_waiting_requests_adapters_load_ahead_in_their_order():
    gate = Gate(ready=lambda v: v == "v1")
    s = Scheduler(SchedulerConfig(max_num_seqs=2), BlockManager(64, 4), gate)
    for name, adapter in (("a", "v2"), ("b", "v1"), ("c", "v3"), ("d", "v1"), ("e", "v4")):
        s.add(seq(name, adapter=adapter))
    s.add(seq("f"))
    assert admitted(s) == ["b", "d"]  # resident adapters go ahead; a's and c's load
    # v1 runs already and the base model needs none; at most a step's worth of adapters.
    assert gate.ahead == [["v2", "v3"]]


def test_behind_a_starving_request_short_of_room_only_base_model_requests_go_on():
    gate = Gate(ready=lambda v: v != "cold")
    gate.short_of_room = lambda v: v == "cold"  # its load found every page pinned
    s = Scheduler(SchedulerConfig(starve_steps=2), BlockManager(64, 4), gate)
    s.add(seq("cold", adapter="cold"))
    s.add(seq("warm1", adapter="v1"))
    assert admitted(s) == ["warm1"]  # cold has not waited long: the resident one goes ahead
    s.schedule()
    s.add(seq("warm2", adapter="v1"))  # would keep v1 pinned, which cold may need the room of
    s.add(seq("base"))
    assert admitted(s) == ["warm1", "base"]
    assert gate.ahead[-1] == ["cold"]  # and nothing behind it is loaded ahead


class OneSlot:
    """A slab with room for one adapter: a load starts when no running sequence holds the
    adapter there, and lands when the next step begins (land())."""

    def __init__(self):
        self.scheduler, self.resident, self.load, self.short = None, None, None, set()

    def ready(self, version):
        if version == self.resident:
            return True
        self._start(version)
        return False

    def short_of_room(self, version):
        return version in self.short

    def load_ahead(self, versions):
        for version in versions:
            if version != self.resident:
                self._start(version)

    def _start(self, version):
        pinned = any(s.request.adapter == self.resident for s in self.scheduler.running)
        if self.load is None and not pinned:
            self.load, self.resident = version, None
            self.short.discard(version)
        elif self.load != version:
            self.short.add(version)

    def land(self):
        if self.load is not None:
            self.resident, self.load = self.load, None


def flood(starve_steps, num_steps=60, hot_tokens=3, cold_at=5):
    """A new request of adapter "hot" every step, each decoding hot_tokens; one of "cold" at
    step cold_at. The steps the cold one waited to be admitted (None: never)."""
    gate = OneSlot()
    s = Scheduler(SchedulerConfig(starve_steps=starve_steps), BlockManager(1024, 4), gate)
    gate.scheduler = s
    cold = seq("cold", n=4, adapter="cold")
    for step in range(num_steps):
        gate.land()
        s.add(seq(f"h{step}", n=4, adapter="hot"))
        if step == cold_at:
            s.add(cold)
        for item in s.schedule().scheduled:
            s.blocks.mark_computed(item.seq, item.num_new_tokens)
            item.seq.token_ids.append(1)
            if item.seq is cold:
                return step - cold_at
            if item.seq.num_output_tokens == hot_tokens:
                s.remove(item.seq)
    return None


def test_a_flood_of_one_resident_adapter_never_starves_one_that_finds_no_room():
    # Once cold has waited starve_steps, no younger hot request is admitted: the running
    # ones finish within hot_tokens steps, cold's load lands the step after, then it runs.
    assert flood(starve_steps=4) <= 4 + 3 + 2
    assert flood(starve_steps=10**6) is None  # without the bound, the flood keeps it out
