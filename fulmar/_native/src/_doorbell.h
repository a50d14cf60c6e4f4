/* For native threads that never hold the GIL (the archive's recorder): the
 * doorbell wait itself, without fulmar_doorbell_wait's release of the GIL. */
#ifndef FULMAR_DOORBELL_PRIVATE_H
#define FULMAR_DOORBELL_PRIVATE_H

#include <stdint.h>

int32_t fulmar_doorbell_wait_without_gil(char *base, int64_t offset, int32_t token, int64_t timeout_ns);

#endif
