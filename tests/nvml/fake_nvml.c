/*
 * A fake libnvidia-ml.so.1 for storwatch's tests: every NVML entry point that storwatch/sources/gpu.py (through the
 * real nvidia-ml-py bindings) calls, answering from a script named by FAKE_NVML_SCRIPT.
 *
 * Build: gcc -shared -fPIC -O2 -pthread -o libnvidia-ml.so.1 fake_nvml.c
 * Use:   LD_LIBRARY_PATH=<dir of the .so> FAKE_NVML_SCRIPT=<file> [FAKE_NVML_COUNTS=<file>] python ...
 *
 * The script is read at nvmlInit and re-read whenever its mtime, size or inode changes; that is checked at init, on
 * every nvmlDeviceGetCount_v2 (once per sampling tick) and on every nvmlEventSetWait_v2, so a test can change values
 * between ticks. FAKE_NVML_SCRIPT may name a directory instead: its files named *.txt (not starting with '.') are
 * read in name order as one script, again whenever one of them is added, removed or changed, so that several
 * processes can each script their own GPUs in a file of their own (replaced atomically, with a temporary whose name
 * does not end in .txt). One directive a line, '#' starts a comment, values are integers (0x... allowed) unless
 * noted:
 *
 *   driver VERSION                            nvmlSystemGetDriverVersion (a word; default 550.54.15)
 *   init error=CODE                           nvmlInit* fails with CODE (e.g. 9 = NVML_ERROR_DRIVER_NOT_LOADED)
 *   gpu I [uuid=S] [name=S] [util=PCT] [mem_util=PCT] [mem_used=B] [mem_reserved=B] [mem_total=B] [power_mw=MW]
 *         [temp=C] [throttle=BITS] [xid=CODE:COUNT,...] [samples=TS_US:PCT,...] [sample_ms=MS]
 *                                             one GPU at index I (indices must be 0..N-1); name may use '_' for ' '.
 *                                             xid counts are cumulative: raising one delivers the difference as
 *                                             Xid events. Without samples=, utilisation samples are made up every
 *                                             sample_ms (default 200) of wall-clock time at util PCT.
 *   proc I pid=P [used=B|na] [sm=PCT]         a compute process on GPU I; sm= adds process utilisation samples
 *   mig I slot=S [uuid=S] [mem_used=B] [mem_total=B]   a MIG device on GPU I (MIG mode on for that GPU)
 *   notsupported FUNCTION [gpu=I]             FUNCTION answers NVML_ERROR_NOT_SUPPORTED
 *   missing FUNCTION                          FUNCTION answers NVML_ERROR_FUNCTION_NOT_FOUND
 *   error FUNCTION code=CODE [gpu=I]          FUNCTION answers CODE
 *   lost I after_calls=N                      calls on GPU I answer NVML_ERROR_GPU_IS_LOST once more than N calls
 *                                             (counted from library load) have named it
 *   slow FUNCTION ms=MS [gpu=I] [times=K]     FUNCTION sleeps MS first (the first K times only, when given)
 *
 * FAKE_NVML_COUNTS names a file rewritten as "key value" lines on init, shutdown and each slow call: init_attempts,
 * init, shutdown, slow_entered, slow_returned.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define EXPORT __attribute__((visibility("default")))

#define MAX_GPUS 64
#define MAX_PROCS 256
#define MAX_MIG_SLOTS 8
#define MAX_MIGS 128
#define MAX_RULES 64
#define MAX_SAMPLES 128
#define MAX_XIDS 16
#define STR 96

/* The layouts nvidia-ml-py's ctypes structures use (pynvml.py: c_nvml*_t). */
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* _v2 and _v3 share it */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* Handles point into these arrays, so they stay valid across script reloads. */
struct nvmlDevice_st {
    int is_mig;
    int gpu;
    int slot;
};
typedef struct nvmlDevice_st *nvmlDevice_t;
static struct nvmlDevice_st gpu_handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG_SLOTS];

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct nvmlEventSet_st {
    int in_use;
    int registered[MAX_GPUS];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;
#define MAX_EVENT_SETS 8
static struct nvmlEventSet_st event_sets[MAX_EVENT_SETS];
#define XID_EVENT 0x8ULL

struct xid {
    unsigned code;
    unsigned long long count;
};
struct sample {
    unsigned long long ts_us;
    unsigned value;
};
struct gpu {
    char uuid[STR], name[STR];
    unsigned util, mem_util, temp, power_mw;
    unsigned long long mem_used, mem_reserved, mem_total, throttle;
    struct xid xids[MAX_XIDS];
    int nxids;
    struct sample samples[MAX_SAMPLES];
    int nsamples; /* -1: made up every sample_ms */
    unsigned sample_ms;
    long long lost_after; /* -1: never */
};
struct proc {
    int gpu;
    unsigned pid;
    unsigned long long used;
    int sm; /* -1: no utilisation samples */
};
struct mig {
    int gpu, slot;
    char uuid[STR];
    unsigned long long mem_used, mem_total;
};
enum rule_kind { RULE_NOTSUPPORTED, RULE_MISSING, RULE_ERROR, RULE_SLOW };
struct rule {
    enum rule_kind kind;
    char fn[64];
    int gpu; /* -1: any */
    int code;
    long ms;
    long times; /* -1: always */
    long done;  /* times slept so far; kept across reloads while the same rule stays */
};
struct script {
    char driver[STR];
    int init_error;
    struct gpu gpus[MAX_GPUS];
    int ngpus;
    struct proc procs[MAX_PROCS];
    int nprocs;
    struct mig migs[MAX_MIGS];
    int nmigs;
    struct rule rules[MAX_RULES];
    int nrules;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct script S;
static int script_loaded;
static unsigned long long script_sig; /* of the script as last read (script_files) */
static int refcount;
static unsigned long long gpu_calls[MAX_GPUS];
/* Xid events delivered so far, per GPU and code, across reloads: a script's counts are cumulative. */
static struct xid xid_delivered[MAX_GPUS][MAX_XIDS];
static int xid_delivered_n[MAX_GPUS];
static unsigned long long init_time_us;
static long counts_init_attempts, counts_init, counts_shutdown, counts_slow_entered, counts_slow_returned;

static unsigned long long now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
}

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fake_nvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void write_counts(void) {
    const char *path = getenv("FAKE_NVML_COUNTS");
    if (!path || !*path)
        return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "init_attempts %ld\ninit %ld\nshutdown %ld\nslow_entered %ld\nslow_returned %ld\n",
            counts_init_attempts, counts_init, counts_shutdown, counts_slow_entered, counts_slow_returned);
    fclose(f);
    rename(tmp, path);
}

/* -- the script */

static unsigned long long num(const char *s) { return strtoull(s, NULL, 0); }

static const char *opt(char **words, int n, const char *key) {
    size_t k = strlen(key);
    for (int i = 0; i < n; i++)
        if (strncmp(words[i], key, k) == 0 && words[i][k] == '=')
            return words[i] + k + 1;
    return NULL;
}

/* A name with '_' for ' ' (a script line splits on spaces). */
static void copy_name(char *dst, const char *src) {
    snprintf(dst, STR, "%s", src);
    for (char *p = dst; *p; p++)
        if (*p == '_')
            *p = ' ';
}

static void parse_gpu(struct script *s, char **w, int n) {
    if (n < 2)
        return;
    int i = atoi(w[1]);
    if (i < 0 || i >= MAX_GPUS) {
        warn("gpu index %d out of range", i);
        return;
    }
    struct gpu *g = &s->gpus[i];
    if (i + 1 > s->ngpus)
        s->ngpus = i + 1;
    const char *v;
    long long lost_after = g->lost_after;
    memset(g, 0, sizeof *g);
    g->lost_after = lost_after;
    snprintf(g->uuid, STR, "GPU-00000000-0000-0000-0000-%012d", i);
    snprintf(g->name, STR, "Fake GPU");
    g->mem_total = 80ULL << 30;
    g->sample_ms = 200;
    g->nsamples = -1;
    if ((v = opt(w, n, "uuid")))
        snprintf(g->uuid, STR, "%s", v);
    if ((v = opt(w, n, "name")))
        copy_name(g->name, v);
    if ((v = opt(w, n, "util")))
        g->util = (unsigned)num(v);
    if ((v = opt(w, n, "mem_util")))
        g->mem_util = (unsigned)num(v);
    if ((v = opt(w, n, "mem_used")))
        g->mem_used = num(v);
    if ((v = opt(w, n, "mem_reserved")))
        g->mem_reserved = num(v);
    if ((v = opt(w, n, "mem_total")))
        g->mem_total = num(v);
    if ((v = opt(w, n, "power_mw")))
        g->power_mw = (unsigned)num(v);
    if ((v = opt(w, n, "temp")))
        g->temp = (unsigned)num(v);
    if ((v = opt(w, n, "throttle")))
        g->throttle = num(v);
    if ((v = opt(w, n, "sample_ms")))
        g->sample_ms = (unsigned)num(v) ? (unsigned)num(v) : 200;
    if ((v = opt(w, n, "xid"))) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", v);
        for (char *tok = strtok(buf, ","); tok && g->nxids < MAX_XIDS; tok = strtok(NULL, ",")) {
            char *colon = strchr(tok, ':');
            g->xids[g->nxids].code = (unsigned)num(tok);
            g->xids[g->nxids].count = colon ? num(colon + 1) : 1;
            g->nxids++;
        }
    }
    if ((v = opt(w, n, "samples"))) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", v);
        g->nsamples = 0;
        for (char *tok = strtok(buf, ","); tok && g->nsamples < MAX_SAMPLES; tok = strtok(NULL, ",")) {
            char *colon = strchr(tok, ':');
            g->samples[g->nsamples].ts_us = num(tok);
            g->samples[g->nsamples].value = colon ? (unsigned)num(colon + 1) : 0;
            g->nsamples++;
        }
    }
}

static void parse_line(struct script *s, char *line) {
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *w[48];
    int n = 0;
    for (char *tok = strtok(line, " \t\r\n"); tok && n < 48; tok = strtok(NULL, " \t\r\n"))
        w[n++] = tok;
    if (n == 0)
        return;
    const char *v;
    if (strcmp(w[0], "driver") == 0 && n >= 2) {
        snprintf(s->driver, STR, "%s", w[1]);
    } else if (strcmp(w[0], "init") == 0) {
        if ((v = opt(w, n, "error")))
            s->init_error = (int)num(v);
    } else if (strcmp(w[0], "gpu") == 0) {
        parse_gpu(s, w, n);
    } else if (strcmp(w[0], "proc") == 0 && n >= 2 && s->nprocs < MAX_PROCS) {
        struct proc *p = &s->procs[s->nprocs++];
        p->gpu = atoi(w[1]);
        p->pid = (v = opt(w, n, "pid")) ? (unsigned)num(v) : 0;
        v = opt(w, n, "used");
        p->used = !v ? 0 : strcmp(v, "na") == 0 ? ~0ULL : num(v);
        p->sm = (v = opt(w, n, "sm")) ? (int)num(v) : -1;
    } else if (strcmp(w[0], "mig") == 0 && n >= 2 && s->nmigs < MAX_MIGS) {
        struct mig *m = &s->migs[s->nmigs++];
        m->gpu = atoi(w[1]);
        m->slot = (v = opt(w, n, "slot")) ? (int)num(v) : 0;
        if (m->slot < 0 || m->slot >= MAX_MIG_SLOTS)
            m->slot = 0;
        snprintf(m->uuid, STR, "MIG-%d-%d", m->gpu, m->slot);
        if ((v = opt(w, n, "uuid")))
            snprintf(m->uuid, STR, "%s", v);
        m->mem_used = (v = opt(w, n, "mem_used")) ? num(v) : 0;
        m->mem_total = (v = opt(w, n, "mem_total")) ? num(v) : 10ULL << 30;
    } else if (strcmp(w[0], "lost") == 0 && n >= 2) {
        int i = atoi(w[1]);
        if (i >= 0 && i < MAX_GPUS)
            s->gpus[i].lost_after = (v = opt(w, n, "after_calls")) ? (long long)num(v) : 0;
    } else if ((strcmp(w[0], "notsupported") == 0 || strcmp(w[0], "missing") == 0 || strcmp(w[0], "error") == 0 ||
                strcmp(w[0], "slow") == 0) &&
               n >= 2 && s->nrules < MAX_RULES) {
        struct rule *r = &s->rules[s->nrules++];
        r->kind = w[0][0] == 'n' ? RULE_NOTSUPPORTED : w[0][0] == 'm' ? RULE_MISSING : w[0][0] == 'e' ? RULE_ERROR
                                                                                                         : RULE_SLOW;
        snprintf(r->fn, sizeof r->fn, "%s", w[1]);
        r->gpu = (v = opt(w, n, "gpu")) ? (int)num(v) : -1;
        r->code = (v = opt(w, n, "code")) ? (int)num(v) : NVML_ERROR_UNKNOWN;
        r->ms = (v = opt(w, n, "ms")) ? (long)num(v) : 0;
        r->times = (v = opt(w, n, "times")) ? (long)num(v) : -1;
    } else {
        warn("unknown directive '%s'", w[0]);
    }
}

/* A script directory: its *.txt files, read in name order as one script (each file ends a line). */
#define MAX_SCRIPT_FILES 256
#define MAX_SCRIPT_BYTES (1 << 20)

static int is_script_file(const struct dirent *e) {
    size_t n = strlen(e->d_name);
    return e->d_name[0] != '.' && n > 4 && strcmp(e->d_name + n - 4, ".txt") == 0;
}

/* An FNV-1a step: the signature of what was read, to see any change of a file's name, inode, mtime or size. */
static unsigned long long fnv(unsigned long long h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static unsigned long long stat_signature(unsigned long long h, const struct stat *st) {
    h = fnv(h, &st->st_ino, sizeof st->st_ino);
    h = fnv(h, &st->st_mtim.tv_sec, sizeof st->st_mtim.tv_sec);
    h = fnv(h, &st->st_mtim.tv_nsec, sizeof st->st_mtim.tv_nsec);
    return fnv(h, &st->st_size, sizeof st->st_size);
}

/* The script's files (path itself, or a directory's *.txt in name order) and their signature; 0 files on error. */
static int script_files(const char *path, const struct stat *st, char files[][4096], unsigned long long *sig) {
    *sig = stat_signature(14695981039346656037ULL, st);
    if (!S_ISDIR(st->st_mode)) {
        snprintf(files[0], 4096, "%s", path);
        return 1;
    }
    struct dirent **list;
    int n = scandir(path, &list, is_script_file, alphasort);
    if (n < 0)
        return 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        struct stat fst;
        if (k < MAX_SCRIPT_FILES) {
            snprintf(files[k], 4096, "%s/%s", path, list[i]->d_name);
            if (stat(files[k], &fst) == 0 && S_ISREG(fst.st_mode)) {
                *sig = fnv(stat_signature(*sig, &fst), list[i]->d_name, strlen(list[i]->d_name));
                k++;
            }
        }
        free(list[i]);
    }
    free(list);
    return k;
}

/* gpu lines reset a GPU's fields, so they are parsed first and the other lines (lost, mig, ...) after them. */
static void reload_if_changed(int force) {
    const char *path = getenv("FAKE_NVML_SCRIPT");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        if (!script_loaded || force) {
            memset(&S, 0, sizeof S);
            snprintf(S.driver, STR, "550.54.15");
            script_loaded = 1;
        }
        return;
    }
    static char files[MAX_SCRIPT_FILES][4096];
    unsigned long long sig;
    int nfiles = script_files(path, &st, files, &sig);
    if (script_loaded && !force && sig == script_sig)
        return;
    static char text[MAX_SCRIPT_BYTES + 2];
    size_t len = 0;
    for (int i = 0; i < nfiles; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f) {
            if (!S_ISDIR(st.st_mode))
                return;
            continue; /* replaced or removed since the listing: the next check sees a new signature */
        }
        len += fread(text + len, 1, MAX_SCRIPT_BYTES - len, f);
        fclose(f);
        if (len > 0 && text[len - 1] != '\n')
            text[len++] = '\n';
    }
    text[len] = 0;
    static struct script next;
    memset(&next, 0, sizeof next);
    snprintf(next.driver, STR, "550.54.15");
    for (int i = 0; i < MAX_GPUS; i++)
        next.gpus[i].lost_after = -1;
    char line[8192];
    for (int pass = 0; pass < 2; pass++) {
        for (const char *p = text; *p;) {
            const char *eol = strchr(p, '\n');
            size_t n = eol ? (size_t)(eol - p) + 1 : strlen(p);
            snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
            p += n;
            char first[16] = {0};
            sscanf(line, "%15s", first);
            if ((strcmp(first, "gpu") == 0) == (pass == 0))
                parse_line(&next, line);
        }
    }
    for (int i = 0; i < next.nrules; i++)
        for (int j = 0; j < S.nrules; j++)
            if (S.rules[j].kind == next.rules[i].kind && strcmp(S.rules[j].fn, next.rules[i].fn) == 0 &&
                S.rules[j].gpu == next.rules[i].gpu && S.rules[j].ms == next.rules[i].ms)
                next.rules[i].done = S.rules[j].done;
    S = next;
    script_sig = sig;
    script_loaded = 1;
}

/* -- the common entry check */

static struct gpu *gpu_of(nvmlDevice_t d) {
    if (!d)
        return NULL;
    if (d >= gpu_handles && d < gpu_handles + MAX_GPUS) {
        int i = (int)(d - gpu_handles);
        return i < S.ngpus ? &S.gpus[i] : NULL;
    }
    struct nvmlDevice_st *m0 = &mig_handles[0][0];
    if (d >= m0 && d < m0 + MAX_GPUS * MAX_MIG_SLOTS)
        return d->gpu < S.ngpus ? &S.gpus[d->gpu] : NULL;
    return NULL;
}

static struct mig *mig_of(nvmlDevice_t d) {
    struct nvmlDevice_st *m0 = &mig_handles[0][0];
    if (!d || d < m0 || d >= m0 + MAX_GPUS * MAX_MIG_SLOTS)
        return NULL;
    for (int i = 0; i < S.nmigs; i++)
        if (S.migs[i].gpu == d->gpu && S.migs[i].slot == d->slot)
            return &S.migs[i];
    return NULL;
}

/* A slow rule for fn sleeps here, with the lock released, so nothing else in the library waits on it. */
static void maybe_slow(const char *fn, int gpu_index) {
    for (int i = 0; i < S.nrules; i++) {
        struct rule *r = &S.rules[i];
        if (r->kind != RULE_SLOW || strcmp(r->fn, fn) != 0 || (r->gpu >= 0 && r->gpu != gpu_index))
            continue;
        if (r->times >= 0 && r->done >= r->times)
            continue;
        r->done++;
        counts_slow_entered++;
        write_counts();
        long ms = r->ms;
        pthread_mutex_unlock(&lock);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        pthread_mutex_lock(&lock);
        counts_slow_returned++;
        write_counts();
        return;
    }
}

/* Called first by every function but init, with the lock held: counts the call against the GPU, applies the rules. */
static nvmlReturn_t enter(const char *fn, int gpu_index) {
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (gpu_index >= 0) {
        gpu_calls[gpu_index]++;
        long long after = S.gpus[gpu_index].lost_after;
        if (after >= 0 && gpu_calls[gpu_index] > (unsigned long long)after)
            return NVML_ERROR_GPU_IS_LOST;
    }
    for (int i = 0; i < S.nrules; i++) {
        struct rule *r = &S.rules[i];
        if (strcmp(r->fn, fn) != 0 || (r->gpu >= 0 && r->gpu != gpu_index))
            continue;
        switch (r->kind) {
        case RULE_NOTSUPPORTED:
            return NVML_ERROR_NOT_SUPPORTED;
        case RULE_MISSING:
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        case RULE_ERROR:
            return r->code;
        case RULE_SLOW:
            break;
        }
    }
    maybe_slow(fn, gpu_index);
    return refcount == 0 ? NVML_ERROR_UNINITIALIZED : NVML_SUCCESS;
}

#define DEVICE_ENTRY(fn, dev)                                                                                         \
    pthread_mutex_lock(&lock);                                                                                         \
    struct gpu *g = gpu_of(dev);                                                                                       \
    if (refcount > 0 && !g) {                                                                                          \
        pthread_mutex_unlock(&lock);                                                                                   \
        return NVML_ERROR_INVALID_ARGUMENT;                                                                            \
    }                                                                                                                  \
    nvmlReturn_t rc = enter(fn, g ? (int)(g - S.gpus) : -1);                                                           \
    g = gpu_of(dev); /* the script may have been reloaded while a slow call slept */                                   \
    if (rc == NVML_SUCCESS && !g)                                                                                      \
        rc = NVML_ERROR_GPU_IS_LOST;                                                                                   \
    if (rc != NVML_SUCCESS) {                                                                                          \
        pthread_mutex_unlock(&lock);                                                                                   \
        return rc;                                                                                                     \
    }

#define RETURN(rc_)                                                                                                    \
    do {                                                                                                               \
        pthread_mutex_unlock(&lock);                                                                                   \
        return (rc_);                                                                                                  \
    } while (0)

/* -- init and system */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    reload_if_changed(0);
    counts_init_attempts++;
    maybe_slow("nvmlInitWithFlags", -1);
    if (S.init_error) {
        int e = S.init_error;
        write_counts();
        RETURN(e);
    }
    if (refcount == 0)
        init_time_us = now_us();
    refcount++;
    counts_init++;
    write_counts();
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (refcount == 0)
        RETURN(NVML_ERROR_UNINITIALIZED);
    refcount--;
    counts_shutdown++;
    write_counts();
    RETURN(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    default:
        return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", -1);
    if (rc)
        RETURN(rc);
    if (!version || length < strlen(S.driver) + 1)
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    snprintf(version, length, "%s", S.driver);
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    if (refcount > 0)
        reload_if_changed(0);
    nvmlReturn_t rc = enter("nvmlDeviceGetCount_v2", -1);
    if (rc)
        RETURN(rc);
    if (!count)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)S.ngpus;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    if (refcount > 0 && index >= (unsigned)S.ngpus)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex_v2", refcount > 0 ? (int)index : -1);
    if (rc)
        RETURN(rc);
    if (!device)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    gpu_handles[index].gpu = (int)index;
    *device = &gpu_handles[index];
    RETURN(NVML_SUCCESS);
}

/* -- device queries */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_ENTRY("nvmlDeviceGetUUID", device);
    struct mig *m = mig_of(device);
    const char *s = m ? m->uuid : g->uuid;
    if (!uuid || length < strlen(s) + 1)
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    snprintf(uuid, length, "%s", s);
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_ENTRY("nvmlDeviceGetName", device);
    if (!name || length < strlen(g->name) + 1)
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    snprintf(name, length, "%s", g->name);
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEVICE_ENTRY("nvmlDeviceGetUtilizationRates", device);
    if (!utilization)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    utilization->gpu = g->util;
    utilization->memory = g->mem_util;
    RETURN(NVML_SUCCESS);
}

/* The samples newer than last_seen, oldest first, into out (may be NULL); returns how many there are. */
static int samples_since(struct gpu *g, unsigned long long last_seen, struct sample *out, int cap) {
    int n = 0;
    if (g->nsamples >= 0) {
        for (int i = 0; i < g->nsamples; i++)
            if (g->samples[i].ts_us > last_seen) {
                if (out && n < cap)
                    out[n] = g->samples[i];
                n++;
            }
        return n;
    }
    /* Made up: one sample every sample_ms of wall-clock time since init, the newest MAX_SAMPLES kept (a ring). */
    unsigned long long period = (unsigned long long)g->sample_ms * 1000ULL, now = now_us();
    unsigned long long first = (init_time_us / period + 1) * period;
    if (now < first)
        return 0;
    unsigned long long last = now / period * period;
    unsigned long long oldest = last - (MAX_SAMPLES - 1) * period;
    if (oldest < first || oldest > last)
        oldest = first;
    unsigned long long from = last_seen + 1 > oldest ? ((last_seen / period) + 1) * period : oldest;
    for (unsigned long long t = from; t <= last; t += period) {
        if (out && n < cap) {
            out[n].ts_us = t;
            out[n].value = g->util;
        }
        n++;
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, unsigned int type, unsigned long long lastSeenTimeStamp,
                                         unsigned int *sampleValType, unsigned int *sampleCount, nvmlSample_t *samples) {
    DEVICE_ENTRY("nvmlDeviceGetSamples", device);
    if (type != 1 /* NVML_GPU_UTILIZATION_SAMPLES */ || !sampleCount || !sampleValType)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *sampleValType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
    if (!samples) {
        /* As the driver does: with no buffer, say how large one must be. */
        *sampleCount = MAX_SAMPLES;
        RETURN(NVML_SUCCESS);
    }
    static struct sample buf[MAX_SAMPLES];
    int n = samples_since(g, lastSeenTimeStamp, buf, MAX_SAMPLES);
    if (n > MAX_SAMPLES)
        n = MAX_SAMPLES;
    if (n == 0)
        RETURN(NVML_ERROR_NOT_FOUND);
    if ((unsigned)n > *sampleCount)
        n = (int)*sampleCount;
    for (int i = 0; i < n; i++) {
        samples[i].timeStamp = buf[i].ts_us;
        memset(&samples[i].sampleValue, 0, sizeof samples[i].sampleValue);
        samples[i].sampleValue.uiVal = buf[i].value;
    }
    *sampleCount = (unsigned)n;
    RETURN(NVML_SUCCESS);
}

static void fill_memory(nvmlDevice_t device, struct gpu *g, unsigned long long *total, unsigned long long *used,
                        unsigned long long *reserved) {
    struct mig *m = mig_of(device);
    *total = m ? m->mem_total : g->mem_total;
    *used = m ? m->mem_used : g->mem_used;
    *reserved = m ? 0 : g->mem_reserved;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE_ENTRY("nvmlDeviceGetMemoryInfo", device);
    if (!memory)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, used, reserved;
    fill_memory(device, g, &total, &used, &reserved);
    /* v1 counts the driver's reservation as used, as the real library does */
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - used - reserved;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE_ENTRY("nvmlDeviceGetMemoryInfo_v2", device);
    if (!memory)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != ((2U << 24) | (unsigned)sizeof(nvmlMemory_v2_t)))
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, used, reserved;
    fill_memory(device, g, &total, &used, &reserved);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_ENTRY("nvmlDeviceGetPowerUsage", device);
    if (!power)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *power = g->power_mw;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp) {
    DEVICE_ENTRY("nvmlDeviceGetTemperature", device);
    if (!temp || sensorType != 0)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature) {
    DEVICE_ENTRY("nvmlDeviceGetTemperatureV", device);
    if (!temperature || temperature->sensorType != 0)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != ((1U << 24) | (unsigned)sizeof(nvmlTemperature_v1_t)))
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    temperature->temperature = (int)g->temp;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_ENTRY("nvmlDeviceGetCurrentClocksEventReasons", device);
    if (!reasons)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->throttle;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    DEVICE_ENTRY("nvmlDeviceGetCurrentClocksThrottleReasons", device);
    if (!reasons)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->throttle;
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t running_processes(struct gpu *g, unsigned int *count, nvmlProcessInfo_t *infos) {
    int gi = (int)(g - S.gpus);
    unsigned n = 0;
    for (int i = 0; i < S.nprocs; i++)
        if (S.procs[i].gpu == gi)
            n++;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (n == 0) {
        *count = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned k = 0;
    for (int i = 0; i < S.nprocs; i++)
        if (S.procs[i].gpu == gi) {
            infos[k].pid = S.procs[i].pid;
            infos[k].usedGpuMemory = S.procs[i].used;
            infos[k].gpuInstanceId = 0xFFFFFFFFU;
            infos[k].computeInstanceId = 0xFFFFFFFFU;
            k++;
        }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY("nvmlDeviceGetComputeRunningProcesses_v3", device);
    RETURN(running_processes(g, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    DEVICE_ENTRY("nvmlDeviceGetComputeRunningProcesses_v2", device);
    RETURN(running_processes(g, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    DEVICE_ENTRY("nvmlDeviceGetProcessUtilization", device);
    if (!processSamplesCount)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int gi = (int)(g - S.gpus);
    unsigned long long ts = now_us();
    unsigned n = 0;
    for (int i = 0; i < S.nprocs; i++)
        if (S.procs[i].gpu == gi && S.procs[i].sm >= 0)
            n++;
    /* One sample per process at each call, stamped now: nothing is newer than a stamp at or after now. */
    if (n == 0 || ts <= lastSeenTimeStamp)
        RETURN(NVML_ERROR_NOT_FOUND);
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned k = 0;
    for (int i = 0; i < S.nprocs; i++)
        if (S.procs[i].gpu == gi && S.procs[i].sm >= 0) {
            utilization[k].pid = S.procs[i].pid;
            utilization[k].timeStamp = ts;
            utilization[k].smUtil = (unsigned)S.procs[i].sm;
            utilization[k].memUtil = 0;
            utilization[k].encUtil = 0;
            utilization[k].decUtil = 0;
            k++;
        }
    *processSamplesCount = n;
    RETURN(NVML_SUCCESS);
}

/* -- MIG */

static int gpu_has_mig(int gi) {
    for (int i = 0; i < S.nmigs; i++)
        if (S.migs[i].gpu == gi)
            return 1;
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_ENTRY("nvmlDeviceGetMigMode", device);
    if (!currentMode || !pendingMode)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *currentMode = *pendingMode = (unsigned)gpu_has_mig((int)(g - S.gpus));
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    DEVICE_ENTRY("nvmlDeviceGetMaxMigDeviceCount", device);
    if (!count)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *count = gpu_has_mig((int)(g - S.gpus)) ? 7 : 0;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    DEVICE_ENTRY("nvmlDeviceGetMigDeviceHandleByIndex", device);
    if (!migDevice || index >= MAX_MIG_SLOTS)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    int gi = (int)(g - S.gpus);
    for (int i = 0; i < S.nmigs; i++)
        if (S.migs[i].gpu == gi && S.migs[i].slot == (int)index) {
            struct nvmlDevice_st *h = &mig_handles[gi][index];
            h->is_mig = 1;
            h->gpu = gi;
            h->slot = (int)index;
            *migDevice = h;
            RETURN(NVML_SUCCESS);
        }
    RETURN(NVML_ERROR_NOT_FOUND);
}

/* -- events */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = enter("nvmlEventSetCreate", -1);
    if (rc)
        RETURN(rc);
    if (!set)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_EVENT_SETS; i++)
        if (!event_sets[i].in_use) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].in_use = 1;
            *set = &event_sets[i];
            RETURN(NVML_SUCCESS);
        }
    RETURN(NVML_ERROR_UNKNOWN);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    DEVICE_ENTRY("nvmlDeviceRegisterEvents", device);
    if (!set || !set->in_use || (eventTypes & ~XID_EVENT))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    set->registered[g - S.gpus] = 1;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    DEVICE_ENTRY("nvmlDeviceGetSupportedEventTypes", device);
    if (!eventTypes)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = XID_EVENT;
    RETURN(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    pthread_mutex_lock(&lock);
    if (refcount > 0)
        reload_if_changed(0);
    nvmlReturn_t rc = enter("nvmlEventSetWait_v2", -1);
    if (rc)
        RETURN(rc);
    if (!set || !set->in_use || !data)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int gi = 0; gi < S.ngpus; gi++) {
        if (!set->registered[gi])
            continue;
        struct gpu *g = &S.gpus[gi];
        for (int x = 0; x < g->nxids; x++) {
            struct xid *d = NULL;
            for (int k = 0; k < xid_delivered_n[gi]; k++)
                if (xid_delivered[gi][k].code == g->xids[x].code)
                    d = &xid_delivered[gi][k];
            if (!d && xid_delivered_n[gi] < MAX_XIDS) {
                d = &xid_delivered[gi][xid_delivered_n[gi]++];
                d->code = g->xids[x].code;
                d->count = 0;
            }
            if (!d || d->count >= g->xids[x].count)
                continue;
            d->count++;
            memset(data, 0, sizeof *data);
            data->device = &gpu_handles[gi];
            data->eventType = XID_EVENT;
            data->eventData = g->xids[x].code;
            data->gpuInstanceId = 0xFFFFFFFFU;
            data->computeInstanceId = 0xFFFFFFFFU;
            RETURN(NVML_SUCCESS);
        }
    }
    (void)timeoutms; /* storwatch only polls (timeout 0); a real wait would block here */
    RETURN(NVML_ERROR_TIMEOUT);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = enter("nvmlEventSetFree", -1);
    if (rc)
        RETURN(rc);
    if (!set || !set->in_use)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    set->in_use = 0;
    RETURN(NVML_SUCCESS);
}
