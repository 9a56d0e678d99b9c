/* log.h - leveled logging to stderr. The level lives in a hm_log object owned by whoever
 * owns the engine/CLI run; no process-global state. */
#ifndef HM_CORE_LOG_H
#define HM_CORE_LOG_H

typedef enum hm_log_level { HM_LOG_ERROR = 0, HM_LOG_WARN, HM_LOG_INFO, HM_LOG_DEBUG } hm_log_level;

typedef struct hm_log {
    hm_log_level level;
} hm_log;

void hm_log_printf(const hm_log *log, hm_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
