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
#define FULMAR_COUNTER_RECORD_ALLOCATED 1

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

/* The lowest id at or after from_id of an allocated counter with this type
 * id and, unless registration_id is FULMAR_COUNTERS_ANY_REGISTRATION, this
 * registration id; -1 if none.  Loads as fulmar_counters_snapshot does and
 * stops at the first unused record.  A client that looks up the counters of
 * each of a thousand new publications would otherwise walk thousands of
 * records from Python for each; a caller wanting every counter of a type
 * calls again from the id after the one found. */
#define FULMAR_COUNTERS_ANY_REGISTRATION -9223372036854775807
int32_t fulmar_counters_find(const char *metadata, const char *values, int32_t capacity, int32_t type_id,
                             int64_t registration_id, int32_t from_id);
