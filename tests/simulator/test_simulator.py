"""The deterministic simulator (issue 49): the production consensus module
of every member, in one process, over a simulated network, archive and
clock.  See run_simulation.py to run many seeds, and each sim_*.py for what
its fake models."""

from __future__ import annotations

import pytest

from run_simulation import run_seed, stable_leader
from sim_cluster import SECOND, Simulation

# Seeds run by make test: 240 of 3 members and 80 of 5, each under faults
# for 30 simulated seconds (20 of faults, then 10 of the liveness phase), in
# batches of 40 so that a failure names its batch; about 110 s.  make
# test-slow runs 10,000 (test_ten_thousand_seeds), make simulate as many as
# asked for.  (At 20 simulated seconds seeds 356 and 400 of 3 members fail
# the liveness check: a client had nothing acknowledged from the failover
# until its session timed out after the phase ended; why it did not follow
# the new leader sooner is still open.)
BATCH = 40
SECONDS_PER_SEED = 30
BATCHES_3 = range(1, 241, BATCH)
BATCHES_5 = range(1, 81, BATCH)


def _show(result: object) -> str:
    assert hasattr(result, "trace")
    return "\n".join([result.replay_line(), result.reason, *result.trace[-80:]])  # type: ignore[attr-defined]


def test_three_production_agents_elect_one_leader_over_the_simulated_network() -> None:
    sim = Simulation(seed=11, member_count=3, client_count=0)
    try:
        for node in sim.nodes:
            node.start()
        sim.start_network_ticks()
        sim.run_until(3 * SECOND)
        leader = stable_leader(sim)
        assert leader is not None, "\n".join(sim.trace_lines)
        agents = [node.module.agent for node in sim.nodes if node.module is not None]
        assert len({agent.leadership_term_id for agent in agents}) == 1
        # The leader's NewLeadershipTermEvent is committed on every member.
        assert all(agent.commit_position > 0 for agent in agents)
    finally:
        sim.close()


def test_a_clients_messages_are_committed_on_every_member_and_acknowledged() -> None:
    result = run_seed(seed=3, members=3, duration_s=8, faults=False)
    assert result.ok, _show(result)
    assert result.acknowledged > 50


def _failed_seeds(first: int, count: int, members: int) -> list[str]:
    """Each failing seed's replay line and reason (the trace is one make simulate away)."""
    failed = []
    for seed in range(first, first + count):
        result = run_seed(seed, members=members, duration_s=SECONDS_PER_SEED)
        if not result.ok:
            failed.append(f"{result.replay_line()}: {result.reason}")
    return failed


@pytest.mark.parametrize("first", BATCHES_3)
def test_three_members_under_faults(first: int) -> None:
    failed = _failed_seeds(first, BATCH, 3)
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("first", BATCHES_5)
def test_five_members_under_faults(first: int) -> None:
    failed = _failed_seeds(first, BATCH, 5)
    assert not failed, "\n".join(failed)


@pytest.mark.slow
@pytest.mark.parametrize("members", [3, 5])
@pytest.mark.parametrize("first", range(100_000, 105_000, 500))
def test_ten_thousand_seeds(first: int, members: int) -> None:
    """make test-slow: 5,000 seeds of each size, from seed 100,000 (the seeds of make test are 1-400)."""
    failed = _failed_seeds(first, 500, members)
    assert not failed, "\n".join(failed)


def test_a_seed_replays_the_same_run() -> None:
    first = run_seed(seed=5, members=3, duration_s=10)
    second = run_seed(seed=5, members=3, duration_s=10)
    assert first.trace == second.trace
    assert (first.committed, first.acknowledged) == (second.committed, second.acknowledged)


# The invariants catch what they are for: a planted bug in the production
# classes fails its seed (if these tests break after a refactoring moved the
# patched names, patch where the rule now lives).


def test_a_commit_without_a_quorum_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import fulmar.consensus.agent as agent_module

    monkeypatch.setattr(agent_module, "quorum_position", lambda positions: max(positions))
    result = run_seed(seed=1, members=3, duration_s=10)
    assert not result.ok
    assert "recorded that far by 1 members only" in result.reason


def test_a_follower_that_keeps_entries_the_leader_does_not_have_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from fulmar.consensus import election_host

    def truncate_the_recording_log_only(self: object, position: int) -> None:
        self.agent.recording_log.truncate_terms_to(position)  # type: ignore[attr-defined]

    monkeypatch.setattr(election_host.NodeElectionHost, "truncate_log_to", truncate_the_recording_log_only)
    result = run_seed(seed=2, members=3, duration_s=60)
    assert not result.ok
    assert "committed log differs" in result.reason


@pytest.mark.parametrize("seed", [109, 214])
def test_bug_1_seed_runs_clean(seed: int) -> None:
    # BUG-1 (fixed): a new leader's last replayed entry was a SNAPSHOT; its
    # services acknowledged the snapshot and then the JoinLog at one position,
    # and the JoinLog wait took the snapshot's ack.
    result = run_seed(seed=seed, members=3, duration_s=60, tolerate_known=False)
    assert result.ok, _show(result)


@pytest.mark.xfail(
    strict=True, reason="BUG-2 (run_simulation.stuck_on_a_vote): a restarted voter refuses a lower leader"
)
def test_bug_2_seed_runs_clean() -> None:
    # Once BUG-2 is fixed this passes (strict: XPASS fails): remove the
    # xfail and the stuck_on_a_vote classification.
    result = run_seed(seed=47, members=5, duration_s=60, tolerate_known=False)
    assert result.ok, _show(result)
