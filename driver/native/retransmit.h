/* Retransmission on NAKs: which NAKed ranges a network publication resends,
 * and when (Aeron's RetransmitHandler): a NAK outside the term is counted and
 * ignored; its length is clamped by the flow control; a NAK starting inside
 * a range already scheduled or lingering is suppressed; otherwise the resend
 * goes after the delay and then lingers.  Group semantics (multicast, MDC)
 * keep up to max_retransmits actions and count an overflow when all are
 * busy; unicast keeps one, which a NAK outside it replaces.
 *
 * The delay and the linger are static (Aeron's StaticDelayGenerator, the
 * only kind its driver uses for the sender): FULMAR_RETRANSMIT_DELAY_DEFAULT_NS
 * and _LINGER_DEFAULT_NS by default.  Both are fields, read at each NAK, so they may be changed.
 *
 * No clock, no log buffer: time is now_ns, resends go out through resend. */

/* Aeron's defaults: RETRANSMIT_UNICAST_DELAY_DEFAULT_NS (used for multicast
 * too), RETRANSMIT_UNICAST_LINGER_DEFAULT_NS (10 ms since Aeron 1.44),
 * MAX_RESEND_DEFAULT and MAX_RESEND_MAX. */
#define FULMAR_RETRANSMIT_DELAY_DEFAULT_NS 0
#define FULMAR_RETRANSMIT_LINGER_DEFAULT_NS 10000000
#define FULMAR_RETRANSMIT_MAX_RESEND_DEFAULT 16
#define FULMAR_RETRANSMIT_MAX_RESEND_MAX 256

/* fulmar_retransmit_init's refusals (the struct is left zeroed). */
#define FULMAR_RETRANSMIT_INVALID_MAX_RETRANSMITS -1  /* not from 1 to MAX_RESEND_MAX */
#define FULMAR_RETRANSMIT_INVALID_DELAY -2            /* a negative delay or linger */
#define FULMAR_RETRANSMIT_NULL -3

/* An action's state. */
#define FULMAR_RETRANSMIT_INACTIVE 0
#define FULMAR_RETRANSMIT_DELAYED 1
#define FULMAR_RETRANSMIT_LINGERING 2

/* resend(context, term_id, term_offset, length): send that range of the log again. */
typedef void (*fulmar_resend_fn)(void *context, int32_t term_id, int32_t term_offset, int32_t length);

typedef struct fulmar_retransmit_action_stct
{
    int32_t state;                  /* FULMAR_RETRANSMIT_INACTIVE, _DELAYED or _LINGERING */
    int32_t term_id;
    int32_t term_offset;
    int32_t length;
    int64_t expiry_ns;              /* acts strictly after it */
}
fulmar_retransmit_action_t;

/* What a handler has done, for counters (RetransmitStats). */
typedef struct fulmar_retransmit_stats_stct
{
    int64_t naks_received;          /* every NAK handed to on_nak */
    int64_t invalid_naks;           /* offset outside the term, or no length */
    int64_t naks_suppressed;        /* inside a range already scheduled or lingering */
    int64_t retransmit_overflows;   /* dropped: all actions busy */
    int64_t retransmits_sent;       /* resends made */
}
fulmar_retransmit_stats_t;

typedef struct fulmar_retransmit_handler_stct
{
    int32_t has_group_semantics;
    int32_t pool_size;              /* max_retransmits with group semantics, else 1 */
    int32_t active_count;           /* actions scheduled or lingering */
    int64_t delay_ns;
    int64_t linger_ns;
    fulmar_retransmit_stats_t stats;
    fulmar_retransmit_action_t actions[FULMAR_RETRANSMIT_MAX_RESEND_MAX];
}
fulmar_retransmit_handler_t;

/* 0, or FULMAR_RETRANSMIT_INVALID_* / _NULL.  max_retransmits is checked
 * even for unicast, which keeps one action whatever it says.  Owns no
 * memory beyond the struct: there is nothing to close. */
int32_t fulmar_retransmit_init(
    fulmar_retransmit_handler_t *h, int32_t has_group_semantics, int32_t max_retransmits, int64_t delay_ns, int64_t linger_ns);

/* A NAK arrived: schedule it, resend at once (delay 0), or ignore it.  The
 * length is clamped by fc's max_retransmission_length; fc NULL: by the
 * default strategy's rule for the group semantics (max with, unicast
 * without).  A NAK is invalid when term_offset is negative or past the last
 * frame's slot (term_length - header), or length is not positive (Aeron
 * checks the offset only; an empty NAK would hold an action and resend
 * nothing).  resend NULL: the actions run as if sent. */
void fulmar_retransmit_on_nak(
    fulmar_retransmit_handler_t *h,
    const fulmar_fc_t *fc,
    int32_t term_id,
    int32_t term_offset,
    int32_t length,
    int32_t term_length,
    int64_t now_ns,
    fulmar_resend_fn resend,
    void *context);

/* Sends the resends whose delay has passed, frees the actions whose linger
 * has; returns how many actions changed. */
int32_t fulmar_retransmit_process_timeouts(fulmar_retransmit_handler_t *h, int64_t now_ns, fulmar_resend_fn resend, void *context);

/* The earliest now_ns at which process_timeouts would change an action (one
 * nanosecond after the earliest expiry, as actions expire strictly after),
 * or INT64_MAX when no action is active. */
int64_t fulmar_retransmit_next_deadline_ns(const fulmar_retransmit_handler_t *h);

/* How much of a retransmit range the publication can resend now (0: none):
 * only what was sent (before sender_position) and is still in the log (at
 * or after sender_position - term_length / 2 - max message length), cut at
 * the sender position.  position_bits_to_shift outside 0..31, or a negative
 * length, gives 0. */
int64_t fulmar_retransmit_resend_window_length(
    int32_t term_id, int32_t term_offset, int32_t length, int64_t sender_position, int32_t initial_term_id,
    int32_t position_bits_to_shift);
