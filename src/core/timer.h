/* timer.h - monotonic wall clock. */
#ifndef HM_CORE_TIMER_H
#define HM_CORE_TIMER_H

#include <stdint.h>
#include <time.h>

static inline int64_t hm_time_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#endif
