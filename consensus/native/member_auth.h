/* The members' consensus trailer (issue 48) in C: the one implementation of
 * what fulmar.consensus.member_auth describes, used by the Python agent
 * (MemberSigner, MemberVerifier wrap it) and by the native consensus threads
 * (append_position.h, leader_commit.h), so that those threads stay on in a
 * cluster with a secret.
 *
 * Trailer (FULMAR_MEMBER_AUTH_TRAILER_LENGTH bytes, little-endian, after the
 * message's SBE body):
 *   @0 "FMC1", @4 sender i32, @8 receiver i32, @12 key id u32 (0),
 *   @16 boot id u64, @24 counter u64, @32 timestamp i64 (epoch ms),
 *   @40 HMAC-SHA256(key, message || trailer[0:40])[:16].
 *
 * A context is shared by everything in a process that signs or checks: ONE
 * send counter (atomic) for the agent's publisher and the threads alike, so
 * a receiver sees each counter of a boot once.  Because two threads may sign
 * for the same receiver, a message can be offered after one with a higher
 * counter; the receiver keeps, per sender and for the last few boots seen,
 * the highest counter taken and a 64-bit window of the counters below it
 * (IPsec's anti-replay window): a counter within the window not yet taken is
 * accepted, one taken or older than the window is refused.  The replay state
 * is under a mutex (the agent and a thread may check at once), and a check
 * that fails leaves it as it was. */

#define FULMAR_MEMBER_AUTH_TRAILER_LENGTH 56
#define FULMAR_MEMBER_AUTH_MAX_MEMBERS 16
#define FULMAR_MEMBER_AUTH_BOOTS_KEPT 4
#define FULMAR_MEMBER_AUTH_REPLAY_WINDOW 64
/* A check's refusals (negative: a check returns the body's length otherwise). */
#define FULMAR_MEMBER_AUTH_NO_TRAILER -1
#define FULMAR_MEMBER_AUTH_WRONG_MAC -2
#define FULMAR_MEMBER_AUTH_OTHER_RECEIVER -3
#define FULMAR_MEMBER_AUTH_NOT_A_MEMBER -4
#define FULMAR_MEMBER_AUTH_TOO_SHORT_FOR_MEMBER_ID -5
#define FULMAR_MEMBER_AUTH_MEMBER_ID_MISMATCH -6
#define FULMAR_MEMBER_AUTH_OUTSIDE_WINDOW -7
#define FULMAR_MEMBER_AUTH_REPLAYED -8
/* From a boot not known yet, signed longer than the window before the first
 * message this context took: one sent to this member's previous run (its
 * driver's image held it for the subscription that died), or a replay. */
#define FULMAR_MEMBER_AUTH_BEFORE_START -9
/* The message's own member id field, as a check is told of it. */
#define FULMAR_MEMBER_AUTH_FIELD_NONE 0
#define FULMAR_MEMBER_AUTH_FIELD_NAMES_SENDER 1
#define FULMAR_MEMBER_AUTH_FIELD_NAMES_RECEIVER 2

typedef struct fulmar_member_auth_stct fulmar_member_auth_t;

/* A context for member member_id of member_ids (member_count of them, up to
 * FULMAR_MEMBER_AUTH_MAX_MEMBERS; its own id may be among them), with the
 * derived key (key_length bytes).  boot_id NULL: a random one (getrandom);
 * the first message signed carries counter + 1.  NULL and errno (EINVAL for
 * bad arguments) when it cannot. */
fulmar_member_auth_t *fulmar_member_auth_new(
    const uint8_t *key, int32_t key_length, int32_t member_id, const int32_t *member_ids, int32_t member_count,
    const uint64_t *boot_id, uint64_t counter, int64_t window_ms);
void fulmar_member_auth_free(fulmar_member_auth_t *auth);
uint64_t fulmar_member_auth_boot_id(const fulmar_member_auth_t *auth);
/* The last counter signed with (the next message carries one more). */
uint64_t fulmar_member_auth_counter(const fulmar_member_auth_t *auth);
int64_t fulmar_member_auth_window_ms(const fulmar_member_auth_t *auth);
/* Writes the trailer after the body_length bytes of buffer (which must have
 * FULMAR_MEMBER_AUTH_TRAILER_LENGTH more), addressed to receiver, stamped
 * now_ms; takes the next counter.  Returns the signed message's length. */
int32_t fulmar_member_auth_sign(
    fulmar_member_auth_t *auth, char *buffer, int32_t body_length, int32_t receiver, int64_t now_ms);
/* Checks the trailer of the message of length bytes (trailer included) at
 * now_ms, in this order: a trailer, its MAC, the receiver (this member), the
 * sender (another member), the message's own member id field (at
 * member_id_offset from the message's first byte, which names the sender or
 * the receiver as field says; FIELD_NONE: none), the timestamp (not more
 * than window_ms ahead of now_ms; and, from a boot this context does not
 * know, not more than window_ms before the first message it took: a known boot's
 * counters guard it, however late it is read), the counter (not taken
 * before).  Returns the body's
 * length, and the sender in *sender (may be NULL), once accepted (its counter
 * is then taken); a FULMAR_MEMBER_AUTH_* refusal, and nothing changed,
 * otherwise. */
int32_t fulmar_member_auth_check(
    fulmar_member_auth_t *auth, const char *message, int32_t length, int64_t now_ms, int32_t member_id_offset,
    int32_t field, int32_t *sender);
/* The epoch milliseconds of CLOCK_REALTIME: what the threads stamp and check with. */
int64_t fulmar_member_auth_now_ms(void);
