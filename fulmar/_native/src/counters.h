/* Agrona's counters layout (fulmar/counters.py has the whole of it): the
 * fields the native code reads, one definition for every component.  A
 * counter's value record is FULMAR_COUNTER_LENGTH bytes in the values buffer
 * (value i64 @0, registration id i64 @8); its metadata record is
 * FULMAR_COUNTER_METADATA_LENGTH bytes (state i32 @0, type id i32 @4). */
#define FULMAR_COUNTER_LENGTH 128
#define FULMAR_COUNTER_REGISTRATION_ID_OFFSET 8
#define FULMAR_COUNTER_METADATA_LENGTH 512
#define FULMAR_COUNTER_TYPE_ID_OFFSET 4
#define FULMAR_COUNTER_RECORD_UNUSED 0

/* One pass over a counters file (cnc.dat's metadata and values buffers) for
 * a reader that wants every counter at once: a metrics scrape reads a few
 * hundred counters a hundred times a second, and one call that copies them
 * all costs what a handful of per-word calls from Python do.
 *
 * For each id from 0 it loads the record's state (acquire, pairing with the
 * manager's release store that publishes the record), then its type id,
 * registration id and value; it stops at the first unused record, as every
 * reader does (records are used in id order).  Each output array holds
 * capacity entries; the return value is how many ids were read. */
int32_t fulmar_counters_snapshot(const char *metadata, const char *values, int32_t capacity, int32_t *states,
                                 int32_t *type_ids, int64_t *registration_ids, int64_t *counter_values);
