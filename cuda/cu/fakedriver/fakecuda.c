// A fake CUDA driver (libcuda.so.1) for testing the cu backend's own logic
// on machines without a GPU. It is NOT a model of real hardware and says
// nothing about real devices: "device" memory is malloc'd host memory, and
// each stream is a POSIX thread that runs its copies in order, after a
// small delay proportional to their size, so that work on different
// streams really overlaps and orderings the backend relies on are tested.
//
// It checks, and aborts the process with a message on, what the backend
// must never do: a driver call that needs a context without one current, a
// context stack popped empty, use of a destroyed stream or event, a wait on
// an event never recorded, and freeing memory that a queued or running
// copy still uses.
//
// Built by cuda/cu/fakedriver/build.sh against the cached cuda.h.
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NDEV 2
#define TOTAL ((size_t)1 << 30) /* 1 GiB per fake device */
#define MAGIC_STREAM 0x5354524dU
#define MAGIC_EVENT 0x4556454eU

static void die(const char *what) {
	fprintf(stderr, "fakecuda: FATAL: %s\n", what);
	abort();
}

struct CUctx_st { int dev; int retain; };
static struct CUctx_st ctxs[NDEV];
static size_t used[NDEV];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */

/* thread-local context stack */
static __thread CUcontext stack[16];
static __thread int depth;

static CUcontext current(void) { return depth ? stack[depth - 1] : NULL; }

/* allocations */
struct alloc { uintptr_t p; size_t n; int dev; int host; struct alloc *next; };
static struct alloc *allocs;

/* streams */
enum { OP_COPY, OP_RECORD, OP_WAIT, OP_SYNC };
struct op {
	int kind;
	uintptr_t dst, src; size_t n;
	struct CUevent_st *ev; unsigned gen;
	int *flag;
	struct op *next;
};
struct CUstream_st {
	unsigned magic; int destroyed; int dev;
	struct op *head, *tail; int running; /* running: an op is being executed */
	uintptr_t rdst, rsrc; size_t rn;     /* the running copy */
	pthread_cond_t cv; pthread_t th; int quit;
	struct CUstream_st *next;
};
static struct CUstream_st *streams;

struct CUevent_st { unsigned magic; int destroyed; unsigned recorded, completed; };
static pthread_cond_t evcv = PTHREAD_COND_INITIALIZER;

static int overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

static void *worker(void *arg) {
	struct CUstream_st *s = arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!s->head && !s->quit) pthread_cond_wait(&s->cv, &mu);
		if (!s->head) break;
		struct op *o = s->head;
		if (o->kind == OP_WAIT) {
			while (o->ev->completed < o->gen) pthread_cond_wait(&evcv, &mu);
		} else if (o->kind == OP_COPY) {
			s->running = 1; s->rdst = o->dst; s->rsrc = o->src; s->rn = o->n;
			pthread_mutex_unlock(&mu);
			usleep(20 + (useconds_t)(o->n >> 14)); /* ~64 µs per MiB */
			memmove((void *)o->dst, (void *)o->src, o->n);
			pthread_mutex_lock(&mu);
			s->running = 0;
		} else if (o->kind == OP_RECORD) {
			if (o->ev->completed < o->gen) o->ev->completed = o->gen;
		} else if (o->kind == OP_SYNC) {
			*o->flag = 1;
		}
		s->head = o->next;
		if (!s->head) s->tail = NULL;
		free(o);
		pthread_cond_broadcast(&evcv);
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

static void push(struct CUstream_st *s, struct op *o) {
	o->next = NULL;
	if (s->tail) s->tail->next = o; else s->head = o;
	s->tail = o;
	pthread_cond_signal(&s->cv);
}

static void check_stream(struct CUstream_st *s) {
	if (!s || s->magic != MAGIC_STREAM) die("not a stream (the legacy default stream is not used by the backend)");
	if (s->destroyed) die("use of a destroyed stream");
}
static void check_event(struct CUevent_st *e) {
	if (!e || e->magic != MAGIC_EVENT) die("not an event");
	if (e->destroyed) die("use of a destroyed event");
}

/* Abort if [p, p+n) is used by a queued or running copy. Called with mu held. */
static void check_unused(uintptr_t p, size_t n) {
	for (struct CUstream_st *s = streams; s; s = s->next) {
		if (s->running && (overlaps(p, n, s->rdst, s->rn) || overlaps(p, n, s->rsrc, s->rn)))
			die("memory freed while a copy on it is running");
		for (struct op *o = s->head; o; o = o->next)
			if (o->kind == OP_COPY && (overlaps(p, n, o->dst, o->n) || overlaps(p, n, o->src, o->n)))
				die("memory freed while a copy on it is queued");
	}
}

#define NEEDCTX() do { if (!current()) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned int f) { (void)f; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 11080; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = NDEV; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int o) { if (o < 0 || o >= NDEV) return CUDA_ERROR_INVALID_DEVICE; *d = o; return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
	(void)d; *v = a == CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING ? 1 : 0; return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { snprintf(name, (size_t)len, "fake CUDA device %d (not a GPU)", d); return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { memset(u, 0, sizeof *u); u->bytes[15] = (char)(d + 1); return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
CUresult cuDeviceTotalMem(size_t *b, CUdevice d) { (void)d; *b = TOTAL; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	if (d < 0 || d >= NDEV) return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu); ctxs[d].dev = d; ctxs[d].retain++; pthread_mutex_unlock(&mu);
	*c = &ctxs[d]; return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
	pthread_mutex_lock(&mu);
	if (ctxs[d].retain <= 0) die("primary context released more often than retained");
	ctxs[d].retain--;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent(CUcontext c) { if (depth == 16) die("context stack overflow (push without pop)"); stack[depth++] = c; return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext *c) {
	if (!depth) die("cuCtxPopCurrent with an empty context stack");
	CUcontext t = stack[--depth]; if (c) *c = t; return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current(); return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { if (depth) stack[depth - 1] = c; else if (c) stack[depth++] = c; return CUDA_SUCCESS; }

static CUresult do_alloc(uintptr_t *p, size_t n, int host) {
	int dev = ((struct CUctx_st *)current())->dev;
	pthread_mutex_lock(&mu);
	if (!host && (n > TOTAL || used[dev] + n > TOTAL)) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
	if (host && n > ((size_t)1 << 40)) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
	void *m = malloc(n ? n : 1);
	if (!m) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
	memset(m, 0xAB, n); /* like real device memory: not zeroed */
	struct alloc *a = malloc(sizeof *a);
	a->p = (uintptr_t)m; a->n = n; a->dev = dev; a->host = host; a->next = allocs; allocs = a;
	if (!host) used[dev] += n;
	pthread_mutex_unlock(&mu);
	*p = (uintptr_t)m;
	return CUDA_SUCCESS;
}
static CUresult do_free(uintptr_t p, int host) {
	pthread_mutex_lock(&mu);
	struct alloc **pa = &allocs;
	while (*pa && (*pa)->p != p) pa = &(*pa)->next;
	if (!*pa || (*pa)->host != host) die("free of memory the driver did not allocate (or freed twice)");
	struct alloc *a = *pa;
	check_unused(a->p, a->n);
	*pa = a->next;
	if (!host) used[a->dev] -= a->n;
	memset((void *)a->p, 0xDD, a->n);
	free((void *)a->p); free(a);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr *p, size_t n) { NEEDCTX(); uintptr_t u; CUresult r = do_alloc(&u, n, 0); *p = (CUdeviceptr)u; return r; }
CUresult cuMemFree(CUdeviceptr p) { NEEDCTX(); return do_free((uintptr_t)p, 0); }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int f) { (void)f; NEEDCTX(); uintptr_t u; CUresult r = do_alloc(&u, n, 1); *p = (void *)u; return r; }
CUresult cuMemFreeHost(void *p) { NEEDCTX(); return do_free((uintptr_t)p, 1); }
CUresult cuMemGetInfo(size_t *free_, size_t *total) {
	NEEDCTX(); int dev = ((struct CUctx_st *)current())->dev;
	pthread_mutex_lock(&mu); *free_ = TOTAL - used[dev]; *total = TOTAL; pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
	NEEDCTX();
	if (flags != CU_STREAM_NON_BLOCKING) die("the backend creates non-blocking streams only");
	struct CUstream_st *s = calloc(1, sizeof *s);
	s->magic = MAGIC_STREAM; s->dev = ((struct CUctx_st *)current())->dev;
	pthread_cond_init(&s->cv, NULL);
	pthread_mutex_lock(&mu); s->next = streams; streams = s; pthread_mutex_unlock(&mu);
	pthread_create(&s->th, NULL, worker, s);
	*ps = s;
	return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream s) {
	NEEDCTX();
	pthread_mutex_lock(&mu); check_stream(s); s->destroyed = 1; s->quit = 1; pthread_cond_signal(&s->cv); pthread_mutex_unlock(&mu);
	pthread_join(s->th, NULL); /* streams are never freed: later use is detected */
	return CUDA_SUCCESS;
}
static CUresult enqueue_copy(uintptr_t dst, uintptr_t src, size_t n, CUstream s) {
	NEEDCTX();
	struct op *o = calloc(1, sizeof *o);
	o->kind = OP_COPY; o->dst = dst; o->src = src; o->n = n;
	pthread_mutex_lock(&mu); check_stream(s); push(s, o); pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s) { return enqueue_copy((uintptr_t)d, (uintptr_t)h, n, s); }
CUresult cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s) { return enqueue_copy((uintptr_t)h, (uintptr_t)d, n, s); }
CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { return enqueue_copy((uintptr_t)d, (uintptr_t)x, n, s); }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr x, size_t n, CUstream s) { return enqueue_copy((uintptr_t)d, (uintptr_t)x, n, s); }
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr x, CUcontext xc, size_t n, CUstream s) {
	if (!dc || !xc) die("cuMemcpyPeerAsync without contexts");
	return enqueue_copy((uintptr_t)d, (uintptr_t)x, n, s);
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char c, size_t n, CUstream s) {
	NEEDCTX(); pthread_mutex_lock(&mu); check_stream(s); pthread_mutex_unlock(&mu);
	CUresult r = cuStreamSynchronize(s); memset((void *)d, c, n); return r;
}
CUresult cuStreamSynchronize(CUstream s) {
	int flag = 0;
	struct op *o = calloc(1, sizeof *o);
	o->kind = OP_SYNC; o->flag = &flag;
	pthread_mutex_lock(&mu); check_stream(s); push(s, o);
	while (!flag) pthread_cond_wait(&evcv, &mu);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent *pe, unsigned int f) {
	(void)f; NEEDCTX();
	struct CUevent_st *e = calloc(1, sizeof *e); e->magic = MAGIC_EVENT; *pe = e; return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
	NEEDCTX();
	struct op *o = calloc(1, sizeof *o);
	pthread_mutex_lock(&mu); check_stream(s); check_event(e);
	o->kind = OP_RECORD; o->ev = e; o->gen = ++e->recorded; push(s, o);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
	pthread_mutex_lock(&mu); check_event(e);
	while (e->completed < e->recorded) { pthread_cond_wait(&evcv, &mu); check_event(e); }
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e) {
	pthread_mutex_lock(&mu); check_event(e); CUresult r = e->completed < e->recorded ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS; pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuEventDestroy(CUevent e) { pthread_mutex_lock(&mu); check_event(e); e->destroyed = 1; pthread_mutex_unlock(&mu); return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) {
	(void)f; NEEDCTX();
	struct op *o = calloc(1, sizeof *o);
	pthread_mutex_lock(&mu); check_stream(s); check_event(e);
	if (!e->recorded) die("cuStreamWaitEvent on an event never recorded (a no-op on real CUDA: the ordering would be lost)");
	o->kind = OP_WAIT; o->ev = e; o->gen = e->recorded; push(s, o);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) { die("cuCtxSynchronize: the backend never synchronizes a whole context"); return 0; }

static const char *names[1000];
CUresult cuGetErrorName(CUresult r, const char **s) {
	names[0] = "CUDA_SUCCESS"; names[1] = "CUDA_ERROR_INVALID_VALUE"; names[2] = "CUDA_ERROR_OUT_OF_MEMORY";
	names[101] = "CUDA_ERROR_INVALID_DEVICE"; names[201] = "CUDA_ERROR_INVALID_CONTEXT"; names[600] = "CUDA_ERROR_NOT_READY";
	names[801] = "CUDA_ERROR_NOT_SUPPORTED";
	if ((unsigned)r < 1000 && names[r]) { *s = names[r]; return CUDA_SUCCESS; }
	*s = NULL; return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult r, const char **s) { return cuGetErrorName(r, s); }
