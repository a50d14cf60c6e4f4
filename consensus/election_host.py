"""What the election of a multi-member cluster does to its node: the
``ElectionHost`` of ``election.py`` over the consensus module agent, its
driver and its archive (seed 001).

The election decides; this module acts:

* the log as leader: a multi-destination UDP publication (control-mode
  manual) to every other member's log endpoint, recorded by the local archive
  through a spy, the services following it through a spy too;
* the log as follower: a multi-destination subscription tagged so that the
  archive's recording and the services share its receive endpoint (Aeron's
  channel tags); the live destination is the member's log endpoint, a
  catchup adds the catchup endpoint;
* replication of whole terms from the leader's archive (ReplicateRequest2);
* replays of the local log into the module and its services (``LogReplay``,
  seed 002).

Every wait is asynchronous: a method starts something and the election asks
again on its next duty cycle (``replay_done``, ``is_log_connected``,
``ReplicationHandle.is_done``), so the module keeps answering its peers.

The follower's registrations (the log subscription, the archive recording it,
the catchup and live destinations) may be refused for a while: a restarted
member's endpoint is still bound by its dead predecessor's subscription until
the driver lets it go.  Each is a ``fulmar.retry.Retry``: tried again with an
exponential back-off on the module's clock, its error said once, the election
told "not yet" (it decides: go on, or back to CANVASS after the heartbeat
timeout).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fulmar.archive.client import RecordingSignal, RecordingSignalEvent, SourceLocation
from fulmar.archive.protocol import CONTROL_STREAM_ID
from fulmar.channel_uri import ChannelUri
from fulmar.consensus.cluster_member import find_member
from fulmar.consensus.election import ElectionError, TermEntry
from fulmar.consensus.log_replay import LogReplay
from fulmar.consensus.protocol import NULL_POSITION, NULL_VALUE
from fulmar.consensus.states import ClusterRole, ControlToggle
from fulmar.errors import FulmarError
from fulmar.logbuffer import compute_term_id_from_position, position_bits_to_shift
from fulmar.retry import Retry

if TYPE_CHECKING:
    from fulmar.consensus.agent import ConsensusModuleAgent
    from fulmar.subscription import Image, Subscription


class ArchiveReplication:
    """A ReplicateRequest2 of the leader's log recording into the local one,
    followed through the local archive's recording signals."""

    def __init__(self, host: NodeElectionHost, replication_id: int, dst_recording_id: int, stop_position: int) -> None:
        self.host = host
        self.replication_id = replication_id
        self.dst_recording_id = dst_recording_id
        self.stop_position = stop_position
        self.position = NULL_POSITION
        self.ended = False
        self.error: str | None = None
        self.closed = False

    def on_signal(self, event: RecordingSignalEvent) -> None:
        if self.dst_recording_id == NULL_VALUE and event.signal in (RecordingSignal.REPLICATE, RecordingSignal.START):
            self.dst_recording_id = event.recording_id
        if event.recording_id != self.dst_recording_id:
            return
        if event.position != NULL_POSITION:
            self.position = max(self.position, event.position)
        if event.signal is RecordingSignal.REPLICATE_END or event.signal is RecordingSignal.STOP:
            self.ended = True

    def on_error(self, text: str) -> None:
        self.error = text

    def is_done(self) -> bool:
        if self.error is not None or self.dst_recording_id == NULL_VALUE or not self.ended:
            return False
        stop = self.host.agent.archive.get_stop_position(self.dst_recording_id)
        return stop >= self.stop_position

    def failed(self) -> bool:
        return self.error is not None or (self.ended and not self.is_done())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        host = self.host
        if host.replication is self:
            host.replication = None
        if not self.ended and self.error is None:
            try:
                host.agent.archive.stop_replication(self.replication_id)
            except FulmarError:
                pass  # it ended by itself meanwhile
        if self.dst_recording_id != NULL_VALUE:
            host.adopt_recording(self.dst_recording_id)


class NodeElectionHost:
    """The election's view of this node (see ``election.ElectionHost``)."""

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        self.agent = agent
        self.context = agent.context
        self.members = agent.members
        self.this_member = find_member(self.members, agent.member_id)
        self.replay: LogReplay | None = None
        self.replication: ArchiveReplication | None = None
        # The follower's log subscription and what hangs off it.
        self.log_subscription: Subscription | None = None
        self._join_request: tuple[int, int, int, int] | None = None  # (leader, term, term base, session)
        self._channel_tag = NULL_VALUE
        self._log_session_id = NULL_VALUE
        self._live_destination = f"aeron:udp?endpoint={self.this_member.log_endpoint}"
        self._live_destination_added = False
        self._catchup_destination: str | None = None
        # What the driver or the archive may refuse for a while, each retried with back-off.
        report, recovered = agent.report_error, agent.log_event
        self._subscription_retry = Retry("adding the log subscription", report, recovered)
        self._recording_retry = Retry("asking the archive to record the log", report, recovered)
        self._live_destination_retry = Retry(
            f"adding the live log destination {self.this_member.log_endpoint}", report, recovered
        )
        self._catchup_destination_retry = Retry(
            f"adding the catchup log destination {self.this_member.catchup_endpoint}", report, recovered
        )
        self._recording_failure: str | None = None
        self._term_to_append: tuple[int, int] | None = None
        self._recording_requested = False
        self._recording_subscription_id = NULL_VALUE
        self._misplaced_recording_id = NULL_VALUE
        self._join_ack_id = NULL_VALUE
        self._join_position = NULL_POSITION
        self.log_image: Image | None = None
        self.is_log_joined = False  # the services follow the image (their JoinLog acknowledged)

    # ------------------------------------------------------------- the local log

    def term_entries(self) -> Sequence[TermEntry]:
        terms = sorted(
            (e for e in self.agent.recording_log.entries if e.is_valid_term), key=lambda e: e.leadership_term_id
        )
        return [TermEntry(e.leadership_term_id, e.term_base_log_position, e.log_position) for e in terms]

    def append_position(self) -> int:
        return self.agent.read_append_position()

    def log_recording_id(self) -> int:
        return self.agent.log_recording_id

    def commit_position(self) -> int:
        return self.agent.commit_position

    def time_of_last_leader_update_ns(self) -> int:
        return self.agent.time_of_last_leader_update_ns

    def processed_position(self) -> int:
        return self.agent.log_position

    def truncate_log_to(self, position: int) -> None:
        agent = self.agent
        if position < agent.log_position:
            raise ElectionError(
                f"cannot truncate the log to {position}: this member has applied it to {agent.log_position}"
            )
        if agent.log_recording_id != NULL_VALUE and position < agent.append_position:
            agent.archive.truncate_recording(agent.log_recording_id, position)
        agent.recording_log.truncate_terms_to(position)
        agent.append_position = min(agent.append_position, position)
        agent.log_event(f"log truncated to {position} (uncommitted entries the leader does not have)")

    def drop_term(self, leadership_term_id: int) -> None:
        self.agent.recording_log.drop_last_term(leadership_term_id)

    def append_term(self, leadership_term_id: int, term_base_log_position: int) -> None:
        agent = self.agent
        if agent.recording_log.find_term_entry(leadership_term_id) is not None:
            return
        if agent.log_recording_id == NULL_VALUE:
            raise ElectionError(f"term {leadership_term_id} cannot be recorded: no log recording yet")
        agent.recording_log.append_term(
            agent.log_recording_id, leadership_term_id, term_base_log_position, agent.cluster_time()
        )

    def adopt_recording(self, recording_id: int) -> None:
        """A replication made (or extended) the log recording: it is the log from now on."""
        if self.agent.log_recording_id == NULL_VALUE:
            self.agent.log_recording_id = recording_id
        self.agent.refresh_append_position()

    # ------------------------------------------------------------- archive work

    def replicate(self, leader_member_id: int, leader_recording_id: int, stop_position: int) -> ArchiveReplication:
        agent = self.agent
        leader = find_member(self.members, leader_member_id)
        source = ChannelUri.parse(self.context.archive_remote_control_channel).with_param(
            "endpoint", leader.archive_endpoint
        )
        replication_id = agent.archive.replicate(
            leader_recording_id,
            str(source),
            CONTROL_STREAM_ID,
            dst_recording_id=agent.log_recording_id,
            stop_position=stop_position,
            replication_channel=self.context.between_members(self.context.replication_channel),
            # What this member's archive presents to the leader's.
            encoded_credentials=self.context.archive_client_credentials(),
        )
        self.replication = ArchiveReplication(self, replication_id, agent.log_recording_id, stop_position)
        agent.log_event(
            f"replicating the log from member {leader_member_id}'s recording {leader_recording_id} "
            f"from {agent.append_position} to {stop_position}"
        )
        return self.replication

    def on_recording_signal(self, event: RecordingSignalEvent) -> None:
        if self.agent.on_leader_recording_signal(event):
            return
        if self.replication is not None:
            self.replication.on_signal(event)
        if (
            event.signal in (RecordingSignal.START, RecordingSignal.EXTEND)
            and event.subscription_id == self._recording_subscription_id != NULL_VALUE
        ):
            # (Also after the subscription closed: a recording that started is the log.)
            if event.signal is RecordingSignal.START and event.position != self._join_position:
                # A new recording that does not start where this member's log ends
                # (the image joined late) holds no usable log: it goes.
                self._misplaced_recording_id = event.recording_id
            elif self.agent.log_recording_id == NULL_VALUE:
                self.agent.log_recording_id = event.recording_id
            self._recording_requested = False

    def on_archive_error(self, text: str) -> None:
        if self.replication is not None:
            self.replication.on_error(text)
        if self._recording_requested:
            # Told to the election at its next look at the log (it starts over):
            # raised here it would break off the slow tick that reported it.
            self._recording_failure = text

    def start_replay(self, from_position: int, to_position: int) -> None:
        if self.replay is not None:
            self.replay.close()
        self.replay = LogReplay(self.agent, from_position, to_position, self.agent.now_ns)

    def replay_done(self) -> bool:
        replay = self.replay
        if replay is None:
            return True
        replay.do_work(self.agent.now_ns)
        if replay.is_done:
            self.replay = None
            return True
        return False

    # ------------------------------------------------------------- roles and the live log

    def close_ingress_and_egress(self) -> None:
        self.agent.close_ingress_and_egress()

    def prepare_for_election(self) -> None:
        agent = self.agent
        if self.replay is not None:
            self.replay.close()
            self.replay = None
        if self.replication is not None:
            self.replication.close()
        agent.step_down()
        self.close_follower_log()
        agent.stop_log_recording()
        # Nobody may operate the cluster through this member until it leads
        # again (Aeron's prepareForNewLeadership): cluster-tool sees INACTIVE
        # and says an election is under way, rather than set a toggle that the
        # election would drop.
        agent.control_toggle.set(ControlToggle.INACTIVE)

    def create_log_publication(self, leadership_term_id: int, log_position: int) -> int:
        return self.agent.create_leader_log_publication(log_position)

    def join_log_as_leader(self, leadership_term_id: int, term_base_log_position: int) -> None:
        self.agent.join_log_as_leader(leadership_term_id, term_base_log_position)

    def append_new_leadership_term_event(self, leadership_term_id: int, log_position: int, timestamp: int) -> bool:
        return self.agent.append_new_leadership_term_event(log_position)

    def join_log_as_follower(
        self, leader_member_id: int, leadership_term_id: int, term_base_log_position: int, log_session_id: int
    ) -> bool:
        """The log subscription (no destination yet), the archive recording on
        its endpoint; destinations come when the election says which.  Called
        again after a refusal, it goes on where it stopped (once due)."""
        agent = self.agent
        request = (leader_member_id, leadership_term_id, term_base_log_position, log_session_id)
        if self._join_request != request:
            self.close_follower_log()
            self._join_request = request
            self._channel_tag = agent.aeron.next_correlation_id()
            self._log_session_id = log_session_id
            agent.log_session_id = log_session_id
            self._term_to_append = (leadership_term_id, term_base_log_position)
        if self.log_subscription is None:
            self.log_subscription = self._subscription_retry.attempt(agent.now_ns, self._add_log_subscription)
            if self.log_subscription is None:
                return False
        return self._request_recording()

    def _add_log_subscription(self) -> Subscription:
        params = {
            **self._log_params(),
            "control-mode": "manual",
            "tags": str(self._channel_tag),
            "session-id": str(self._log_session_id),
        }
        quiet_doorbell_id = self.agent.quiet_log_doorbell_id()
        if quiet_doorbell_id is not None:
            params["doorbell-id"] = str(quiet_doorbell_id)
        channel = self.context.between_members(str(ChannelUri("udp", params)))
        return self.agent.aeron.add_subscription(channel, self.context.log_stream_id)

    def _request_recording(self) -> bool:
        """The archive records the log subscription's image (asked once, again after a refusal)."""
        if self._recording_subscription_id != NULL_VALUE:
            return True
        subscription_id = self._recording_retry.attempt(self.agent.now_ns, self._start_recording)
        if subscription_id is None:
            return False
        self._recording_subscription_id = subscription_id
        self._recording_requested = True
        self._join_position = self.agent.read_append_position()
        return True

    def _start_recording(self) -> int:
        agent = self.agent
        if agent.log_recording_id != NULL_VALUE:
            return agent.archive.extend_recording(
                agent.log_recording_id,
                self.shared_log_channel(),
                self.context.log_stream_id,
                SourceLocation.REMOTE,
                auto_stop=True,
            )
        return agent.archive.start_recording(
            self.shared_log_channel(), self.context.log_stream_id, SourceLocation.REMOTE, auto_stop=True
        )

    def shared_log_channel(self) -> str:
        """The follower's log as the archive and the services subscribe to it: the
        subscription's receive endpoint, found by its tag."""
        channel = ChannelUri("udp", {"tags": str(self._channel_tag), "session-id": str(self._log_session_id)})
        return self.context.between_members(str(channel))

    def _log_params(self) -> dict[str, str]:
        log = ChannelUri.parse(self.context.log_channel)
        return {k: v for k, v in log.params.items() if k in ("term-length", "mtu", "rcv-wnd", "so-rcvbuf")}

    def add_live_destination(self) -> bool:
        if self._live_destination_added:
            return True
        subscription = self.log_subscription
        if subscription is None:
            return False
        if (
            self._live_destination_retry.attempt(
                self.agent.now_ns, lambda: _add_destination(subscription, self._live_destination)
            )
            is None
        ):
            return False
        self._live_destination_added = True
        return True

    def is_catchup_near_live(self, leader_log_position: int) -> bool:
        """Within a quarter of a term of ``leader_log_position``: the live log that
        arrives meanwhile waits in the image's term buffers, no gap to recover."""
        image = self.log_image
        if image is None:
            return False
        return self.agent.read_append_position() >= leader_log_position - (image.term_buffer_length >> 2)

    def is_log_connected(self) -> bool:
        """The image exists, the term is in the recording log and the services follow it."""
        agent = self.agent
        subscription = self.log_subscription
        if self._recording_failure is not None:
            failure, self._recording_failure = self._recording_failure, None
            raise ElectionError(f"the archive refused to record the leader's log: {failure}")
        if subscription is None:
            return False
        image = self.log_image
        if image is not None and (image.is_closed or image.is_end_of_stream):
            # (A catchup that ended before the live log flowed: nothing more comes.)
            raise ElectionError(f"the leader's log ended at {image.position} before this member followed it")
        if self.log_image is None:
            image = subscription.image_by_session_id(self._log_session_id)
            if image is None:
                return False
            if image.join_position != self._join_position:
                raise ElectionError(
                    f"the leader's log joined at {image.join_position}, this member's log ends at {self._join_position}"
                )
            self.log_image = image
            agent.on_log_image(image)
        if self._misplaced_recording_id != NULL_VALUE:
            raise ElectionError(
                f"the leader's log reached this member from {self.log_image.join_position}, "
                f"not from where its log ends ({self._join_position})"
            )
        if self._recording_requested:
            return False  # the archive has yet to say it records the image
        if self._term_to_append is not None:
            self.append_term(*self._term_to_append)
            self._term_to_append = None
        if self._join_ack_id == NULL_VALUE:
            self._join_ack_id = agent.next_ack_id(join_log=True)
            agent.service_proxy.join_log(
                self._join_position,
                NULL_POSITION,
                agent.member_id,
                self._log_session_id,
                self.context.log_stream_id,
                False,
                int(ClusterRole.FOLLOWER),
                self.shared_log_channel(),
            )
        if not self.is_log_joined:
            if agent.services_acked(self._join_ack_id, self._join_position) is None:
                return False
            self.is_log_joined = True
            agent.refresh_append_position()
        return True

    def catchup(self, leader_member_id: int, from_position: int) -> str | None:
        subscription = self.log_subscription
        if subscription is None:
            return None
        if self._catchup_destination is None:
            destination = f"aeron:udp?endpoint={self.this_member.catchup_endpoint}"
            if (
                self._catchup_destination_retry.attempt(
                    self.agent.now_ns, lambda: _add_destination(subscription, destination)
                )
                is None
            ):
                return None
            self._catchup_destination = destination
        return self.this_member.catchup_endpoint

    def stop_catchup(self) -> None:
        if self._catchup_destination is not None and self.log_subscription is not None:
            try:
                self.log_subscription.remove_destination(self._catchup_destination)
            except FulmarError as error:
                self.agent.report_error(f"removing the catchup log destination: {type(error).__name__}: {error}")
        self._catchup_destination = None

    def _purge_misplaced_recording(self) -> None:
        archive = self.agent.archive
        recording_id, self._misplaced_recording_id = self._misplaced_recording_id, NULL_VALUE
        try:
            if archive.get_stop_position(recording_id) == NULL_POSITION:
                archive.stop_recording_by_identity(recording_id)
            deadline = time.monotonic() + 5
            while archive.get_stop_position(recording_id) == NULL_POSITION and time.monotonic() < deadline:
                time.sleep(0.001)
            archive.purge_recording(recording_id)
        except FulmarError as error:
            self.agent.log_event(f"purging the misplaced recording {recording_id}: {error}")

    def close_follower_log(self) -> None:
        agent = self.agent
        agent.halt_follower_commit()  # (it reads the log image: not once the log is closed)
        if self.log_subscription is not None:
            # The archive and the services share the endpoint and keep it open
            # for a while: its sockets go now, so the ports can be bound again.
            live = self._live_destination if self._live_destination_added else None
            for destination in (live, self._catchup_destination):
                if destination is not None:
                    try:
                        self.log_subscription.remove_destination(destination)
                    except FulmarError:
                        pass  # never added
            self.log_subscription.close()
        if self._recording_subscription_id != NULL_VALUE:
            try:
                agent.archive.stop_recording_subscription(self._recording_subscription_id)
            except FulmarError:
                pass  # it stopped with its image already (auto stop)
            # A START answered before the stop is in the signals already: the
            # recording it names is the log.
            while agent.archive.signals:
                self.on_recording_signal(agent.archive.signals.popleft())
            self._recording_subscription_id = NULL_VALUE
        if self._misplaced_recording_id != NULL_VALUE:
            self._purge_misplaced_recording()
        self.log_subscription = None
        self.log_image = None
        self._join_request = None
        self._live_destination_added = False
        self._catchup_destination = None
        self._recording_requested = False
        self._recording_failure = None
        self._term_to_append = None
        for retry in (
            self._subscription_retry,
            self._recording_retry,
            self._live_destination_retry,
            self._catchup_destination_retry,
        ):
            retry.reset()
        self._join_ack_id = NULL_VALUE
        self.is_log_joined = False
        self.agent.on_log_image(None)

    # ------------------------------------------------------------- notifications

    def persist_candidate_term_id(self, candidate_term_id: int) -> None:
        self.agent.persist_candidate_term_id(candidate_term_id)

    def on_role_change(self, role: ClusterRole) -> None:
        self.agent.set_role(role)

    def on_leadership_term_change(self, leadership_term_id: int) -> None:
        self.agent.set_leadership_term_id(leadership_term_id)

    def notify_commit_position(self, commit_position: int) -> None:
        self.agent.notify_commit_position(commit_position)

    def election_complete(self, role: ClusterRole, leader_member_id: int, leadership_term_id: int) -> None:
        self.agent.on_multi_member_election_complete(role, leader_member_id, leadership_term_id)


def _add_destination(subscription: Subscription, destination: str) -> bool:
    subscription.add_destination(destination)
    return True


def leader_log_channel(
    log_channel: str, term_length: int | None, mtu: int | None, initial_term_id: int | None, position: int
) -> str:
    """The leader's log publication: ``log_channel``'s parameters on a
    control-mode=manual UDP channel (each follower a destination), continuing
    the recorded log at ``position`` when there is one."""
    params = {
        k: v
        for k, v in ChannelUri.parse(log_channel).params.items()
        if k not in ("endpoint", "control", "control-mode", "session-id", "tags")
    }
    channel = ChannelUri("udp", {**params, "control-mode": "manual", "ssc": "true"})
    if term_length is not None and mtu is not None and initial_term_id is not None:
        term_id = compute_term_id_from_position(position, position_bits_to_shift(term_length), initial_term_id)
        channel = channel.with_param("term-length", term_length).with_param("mtu", mtu)
        channel = channel.with_initial_position(initial_term_id, term_id, position & (term_length - 1))
    return str(channel)
