/*
 * control.c — the shim's side of shim/PROTOCOL.md: one Unix stream connection
 * to the daemon, newline-delimited flat JSON objects, and a control thread
 * that executes swap_out/swap_in and answers granted/denied for `need`.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAXLINE 4096

static int sock_fd = -1;
static int pending_fd = -1; /* the last descriptor the daemon passed (SCM_RIGHTS), for the next `gate` */
static atomic_int connected;
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER;
static char rbuf[2 * MAXLINE];
static size_t rlen;
static atomic_int usage_dirty;
static pthread_t ctl_thread;

/* need: one outstanding at a time */
static pthread_mutex_t need_serial = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t need_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t need_cv = PTHREAD_COND_INITIALIZER;
static long need_seq, need_waiting;
static int need_answer; /* 0 none, 1 granted, 2 denied */

int ms_control_connected(void)
{
	return atomic_load(&connected);
}

void ms_control_usage_changed(void)
{
	atomic_store_explicit(&usage_dirty, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------- tiny JSON */

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
		p++;
	return p;
}

/* skip_value returns the end of the JSON value at p, or NULL. */
static const char *skip_value(const char *p)
{
	if (*p == '"') {
		for (p++; *p && *p != '"'; p++)
			if (*p == '\\' && p[1])
				p++;
		return *p ? p + 1 : NULL;
	}
	if (*p == '{' || *p == '[') {
		int depth = 0;
		for (; *p; p++) {
			if (*p == '"') {
				p = skip_value(p);
				if (!p)
					return NULL;
				p--;
			} else if (*p == '{' || *p == '[') {
				depth++;
			} else if (*p == '}' || *p == ']') {
				if (--depth == 0)
					return p + 1;
			}
		}
		return NULL;
	}
	while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')
		p++;
	return p;
}

/* json_raw finds the top-level key in the object line and returns its raw
 * value token (quotes included for strings) in out. 0 on success. */
static int json_raw(const char *line, const char *key, char *out, size_t outlen)
{
	const char *p = skip_ws(line);
	if (*p != '{')
		return -1;
	p = skip_ws(p + 1);
	size_t klen = strlen(key);
	while (*p == '"') {
		const char *ks = p + 1, *ke = skip_value(p);
		if (!ke)
			return -1;
		int match = (size_t)(ke - 1 - ks) == klen && memcmp(ks, key, klen) == 0;
		p = skip_ws(ke);
		if (*p != ':')
			return -1;
		p = skip_ws(p + 1);
		const char *ve = skip_value(p);
		if (!ve)
			return -1;
		if (match) {
			size_t n = (size_t)(ve - p);
			if (n >= outlen)
				n = outlen - 1;
			memcpy(out, p, n);
			out[n] = 0;
			return 0;
		}
		p = skip_ws(ve);
		if (*p == ',')
			p = skip_ws(p + 1);
	}
	return -1;
}

/* json_str returns the unescaped string value of key. */
static int json_str(const char *line, const char *key, char *out, size_t outlen)
{
	char raw[MAXLINE];
	if (json_raw(line, key, raw, sizeof raw) != 0 || raw[0] != '"')
		return -1;
	size_t k = 0;
	for (const char *p = raw + 1; *p && *p != '"' && k + 1 < outlen; p++) {
		if (*p == '\\' && p[1]) {
			p++;
			switch (*p) {
			case 'n': out[k++] = '\n'; break;
			case 't': out[k++] = '\t'; break;
			case 'r': out[k++] = '\r'; break;
			case 'u': out[k++] = '?'; p += strlen(p) >= 5 ? 4 : strlen(p) - 1; break;
			default: out[k++] = *p; break;
			}
		} else {
			out[k++] = *p;
		}
	}
	out[k] = 0;
	return 0;
}

/* json_escape writes s as a JSON string (with quotes) into out. */
static void json_escape(const char *s, char *out, size_t outlen)
{
	size_t k = 0;
	if (outlen < 3)
		return;
	out[k++] = '"';
	for (; *s && k + 8 < outlen; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			out[k++] = '\\';
			out[k++] = (char)c;
		} else if (c < 0x20) {
			k += (size_t)snprintf(out + k, outlen - k, "\\u%04x", c);
		} else {
			out[k++] = (char)c;
		}
	}
	out[k++] = '"';
	out[k] = 0;
}

/* ----------------------------------------------------------------- socket */

static int send_line(const char *s)
{
	char buf[MAXLINE + 2];
	size_t n = strlen(s);
	if (n > MAXLINE - 1)
		n = MAXLINE - 1;
	memcpy(buf, s, n);
	buf[n++] = '\n';
	pthread_mutex_lock(&write_mu);
	int fd = sock_fd, rc = 0;
	size_t off = 0;
	while (fd >= 0 && off < n) {
		ssize_t w = send(fd, buf + off, n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = -1;
			break;
		}
		off += (size_t)w;
	}
	if (fd < 0)
		rc = -1;
	pthread_mutex_unlock(&write_mu);
	return rc;
}

static void device_name(char *out, size_t outlen)
{
	CUdevice d;
	unsigned char u[16];
	snprintf(out, outlen, "0");
	if (!drv.cuDeviceGet || !drv.cuDeviceGetUuid || drv.cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
	    drv.cuDeviceGetUuid((char *)u, d) != CUDA_SUCCESS)
		return;
	snprintf(out, outlen, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
		 u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* recv_fds is recv that keeps a descriptor passed with SCM_RIGHTS in
 * pending_fd (the daemon sends the gate page's memfd with its `gate` line; the
 * kernel delivers it with that line's first byte, so it is here before the
 * line is parsed). */
static ssize_t recv_fds(char *buf, size_t len)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} cm;
	struct iovec iov = { buf, len };
	struct msghdr mh;
	memset(&mh, 0, sizeof mh);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cm.b;
	mh.msg_controllen = sizeof cm.b;
	ssize_t r = recvmsg(sock_fd, &mh, MSG_CMSG_CLOEXEC);
	if (r < 0)
		return r;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int fds[4];
		memcpy(fds, CMSG_DATA(c), n * sizeof(int) < sizeof fds ? n * sizeof(int) : sizeof fds);
		for (size_t i = 0; i < n && i < 4; i++) {
			if (pending_fd >= 0)
				close(pending_fd);
			pending_fd = fds[i];
		}
	}
	return r;
}

/* read_line blocks up to timeout_ms for one complete line from the socket. */
static int read_line(char *line, size_t linelen, int timeout_ms)
{
	double end = ms_now() + timeout_ms / 1000.0;
	for (;;) {
		char *nl = memchr(rbuf, '\n', rlen);
		if (nl) {
			size_t n = (size_t)(nl - rbuf);
			size_t c = n < linelen - 1 ? n : linelen - 1;
			memcpy(line, rbuf, c);
			line[c] = 0;
			memmove(rbuf, nl + 1, rlen - n - 1);
			rlen -= n + 1;
			return 1;
		}
		if (rlen == sizeof rbuf)
			rlen = 0; /* an over-long line: drop it */
		int left = (int)((end - ms_now()) * 1000);
		if (left < 0)
			return 0;
		struct pollfd pfd = { sock_fd, POLLIN, 0 };
		int pr = poll(&pfd, 1, left);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0)
			return pr == 0 ? 0 : -1;
		ssize_t r = recv_fds(rbuf + rlen, sizeof rbuf - rlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		rlen += (size_t)r;
	}
}

/* ------------------------------------------------------------- the thread */

struct swapctx {
	const char *id;
};

static void send_progress(void *arg, uint64_t done, uint64_t total)
{
	struct swapctx *c = arg;
	char m[256];
	snprintf(m, sizeof m, "{\"type\":\"progress\",\"id\":%s,\"done\":%llu,\"total\":%llu}", c->id,
		 (unsigned long long)done, (unsigned long long)total);
	send_line(m);
}

static void do_swap(const char *id, int out)
{
	char err[512] = "", m[MAXLINE], e[1200];
	uint64_t bytes = 0;
	struct swapctx c = { id };
	double t0 = ms_now();
	int rc = out ? ms_swap_out(err, sizeof err, &bytes, send_progress, &c)
		     : ms_swap_in(err, sizeof err, &bytes, send_progress, &c);
	double secs = ms_now() - t0;
	ms_log("swap %s id=%s: %s, %llu bytes in %.3f s%s%s", out ? "out" : "in", id, rc ? "failed" : "ok",
	       (unsigned long long)bytes, secs, rc ? ": " : "", err);
	if (rc) {
		json_escape(err, e, sizeof e);
		snprintf(m, sizeof m, "{\"type\":\"result\",\"id\":%s,\"ok\":false,\"bytes\":%llu,\"seconds\":%.6f,\"error\":%s}",
			 id, (unsigned long long)bytes, secs, e);
	} else {
		snprintf(m, sizeof m, "{\"type\":\"result\",\"id\":%s,\"ok\":true,\"bytes\":%llu,\"seconds\":%.6f}", id,
			 (unsigned long long)bytes, secs);
	}
	send_line(m);
}

static long json_long(const char *line, const char *key, long def)
{
	char raw[64];
	if (json_raw(line, key, raw, sizeof raw) != 0)
		return def;
	return strtol(raw, NULL, 10);
}

static int json_bool(const char *line, const char *key)
{
	char raw[16];
	return json_raw(line, key, raw, sizeof raw) == 0 && strcmp(raw, "true") == 0;
}

/* handle_gate applies the daemon's priority-gating settings; a `gate` with
 * "page":true comes with the device's page (pending_fd). A bad one is
 * answered with an error and leaves gating as it was. */
static void handle_gate(const char *line)
{
	struct ms_prio_cfg c;
	char policy[32] = "", raw[64] = "", err[256] = "";
	memset(&c, 0, sizeof c);
	json_str(line, "policy", policy, sizeof policy);
	if (strcmp(policy, "gate") == 0)
		c.policy = MS_PG_GATE;
	else if (strcmp(policy, "budget") == 0)
		c.policy = MS_PG_BUDGET;
	else
		c.policy = MS_PG_OFF;
	c.budget = (int)json_long(line, "budget", 0);
	c.depth = (int)json_long(line, "depth", 0);
	c.slot = (int)json_long(line, "slot", -1);
	c.signal = json_bool(line, "signal");
	c.stale_ms = (unsigned)json_long(line, "stale_ms", 0);
	if (json_raw(line, "mask", raw, sizeof raw) == 0)
		c.mask = strtoull(raw, NULL, 10);
	int fd = -1;
	if (json_bool(line, "page")) {
		fd = pending_fd;
		pending_fd = -1;
		if (fd < 0) {
			send_line("{\"type\":\"error\",\"reason\":\"gate: page announced but no descriptor came with it\"}");
			return;
		}
	}
	if (ms_prio_apply(&c, fd, err, sizeof err) != 0) {
		char m[512], e[400];
		ms_log("gate refused: %s", err);
		json_escape(err, e, sizeof e);
		snprintf(m, sizeof m, "{\"type\":\"error\",\"reason\":%s}", e);
		send_line(m);
	}
}

static void handle(const char *line)
{
	char type[64], id[128];
	if (json_str(line, "type", type, sizeof type) != 0) {
		send_line("{\"type\":\"error\",\"reason\":\"message without a type\"}");
		return;
	}
	if (json_raw(line, "id", id, sizeof id) != 0)
		snprintf(id, sizeof id, "null");
	if (strcmp(type, "swap_out") == 0 || strcmp(type, "swap_in") == 0) {
		do_swap(id, type[5] == 'o');
	} else if (strcmp(type, "granted") == 0 || strcmp(type, "denied") == 0) {
		long v = strtol(id[0] == '"' ? id + 1 : id, NULL, 10);
		pthread_mutex_lock(&need_mu);
		if (v == need_waiting && need_waiting) {
			need_answer = type[0] == 'g' ? 1 : 2;
			pthread_cond_broadcast(&need_cv);
		}
		pthread_mutex_unlock(&need_mu);
		if (type[0] == 'd' && ms_log_on) {
			char reason[512] = "";
			json_str(line, "reason", reason, sizeof reason);
			ms_log("need %ld denied: %s", v, reason);
		}
	} else if (strcmp(type, "gate") == 0) {
		handle_gate(line);
	} else if (strcmp(type, "error") == 0) {
		char reason[512] = "";
		json_str(line, "reason", reason, sizeof reason);
		ms_log("daemon error: %s", reason);
	} else if (strcmp(type, "welcome") == 0) {
		/* late or duplicate: nothing to do */
	} else {
		char m[256], t[160], why[100];
		snprintf(why, sizeof why, "unknown type %.60s", type);
		json_escape(why, t, sizeof t);
		snprintf(m, sizeof m, "{\"type\":\"error\",\"reason\":%s}", t);
		send_line(m);
	}
}

static void send_usage(void)
{
	char m[128];
	snprintf(m, sizeof m, "{\"type\":\"usage\",\"bytes\":%llu}", (unsigned long long)atomic_load(&ms_live_bytes));
	send_line(m);
}

static void send_gate_stats(void)
{
	struct migswap_stats st;
	memset(&st, 0, sizeof st);
	ms_prio_get_stats(&st);
	char m[256];
	snprintf(m, sizeof m,
		 "{\"type\":\"gate_stats\",\"holds\":%llu,\"held_seconds\":%.6f,\"busy_periods\":%llu,\"busy_seconds\":%.6f}",
		 (unsigned long long)st.prio_holds, (double)st.prio_held_ns * 1e-9, (unsigned long long)st.prio_busy_periods,
		 (double)st.prio_busy_ns * 1e-9);
	send_line(m);
}

static void *control_main(void *arg)
{
	(void)arg;
	char line[MAXLINE];
	double last_usage = 0, last_gate = 0;
	const char *pp = getenv("MIGSWAP_PREPIN");
	int prepin = pp && strcmp(pp, "1") == 0;
	for (;;) {
		int r = read_line(line, sizeof line, 100);
		if (r < 0)
			break;
		if (r > 0)
			handle(line);
		if (atomic_load_explicit(&usage_dirty, memory_order_relaxed) && ms_now() - last_usage >= 0.1) {
			atomic_store(&usage_dirty, 0);
			send_usage();
			last_usage = ms_now();
			if (prepin)
				ms_swap_prepin();
		}
		if (ms_now() - last_gate >= 0.1 && ms_prio_stats_dirty()) {
			send_gate_stats();
			last_gate = ms_now();
		}
	}
	/* the daemon went away: no more swaps, no more gating; never leave the program blocked */
	ms_log("control connection closed");
	ms_prio_detach();
	pthread_mutex_lock(&write_mu);
	close(sock_fd);
	sock_fd = -1;
	pthread_mutex_unlock(&write_mu);
	atomic_store(&connected, 0);
	pthread_mutex_lock(&need_mu);
	if (need_waiting) {
		need_answer = 2;
		pthread_cond_broadcast(&need_cv);
	}
	pthread_mutex_unlock(&need_mu);
	while (atomic_load(&ms_state) == MIGSWAP_STATE_SWAPPED_OUT) {
		char err[512];
		uint64_t b;
		if (ms_swap_in(err, sizeof err, &b, NULL, NULL) == 0)
			break;
		struct timespec ts = { 1, 0 };
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* socket_path: the daemon's shim socket, $MIGSWAP_SOCKET or the default. */
static const char *socket_path(void)
{
	const char *path = getenv("MIGSWAP_SOCKET");
	return path && *path ? path : "/run/migctl/migswap.sock";
}

/* ms_mps_env (constructor time, before the driver reads its environment):
 * when the daemon runs an MPS control daemon (`migctl daemon --mps`: its
 * control pipe is in SOCKET.mps), join it and set this process's MPS client
 * priority from MIGSWAP_PRIORITY (> 0: normal; otherwise below normal), unless
 * the program set either variable itself or MIGSWAP_MPS=0. */
void ms_mps_env(void)
{
	const char *off = getenv("MIGSWAP_MPS");
	if (off && strcmp(off, "0") == 0)
		return;
	const char *path = socket_path();
	char dir[1024], ctl[1100];
	if ((size_t)snprintf(dir, sizeof dir, "%s.mps", path) >= sizeof dir)
		return;
	snprintf(ctl, sizeof ctl, "%s/control", dir);
	struct stat st;
	if (stat(ctl, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
		return;
	const char *pr = getenv("MIGSWAP_PRIORITY");
	long prio = pr ? strtol(pr, NULL, 10) : 0;
	setenv("CUDA_MPS_PIPE_DIRECTORY", dir, 0);
	setenv("CUDA_MPS_CLIENT_PRIORITY", prio > 0 ? "0" : "1", 0);
	if (prio <= 0) { /* the daemon's settings for best-effort clients (ctxmgr.MPSLowEnv) */
		char envf[1100], line[256];
		snprintf(envf, sizeof envf, "%s/low.env", dir);
		FILE *f = fopen(envf, "re");
		while (f && fgets(line, sizeof line, f)) {
			line[strcspn(line, "\r\n")] = 0;
			char *eq = strchr(line, '=');
			if (eq && eq != line && strncmp(line, "CUDA_MPS_", 9) == 0) {
				*eq = 0;
				setenv(line, eq + 1, 0);
			}
		}
		if (f)
			fclose(f);
	}
	if (getenv("MIGSWAP_LOG") && strcmp(getenv("MIGSWAP_LOG"), "1") == 0)
		fprintf(stderr, "migswap[%d]: mps: CUDA_MPS_PIPE_DIRECTORY=%s CUDA_MPS_CLIENT_PRIORITY=%s\n", (int)getpid(),
			getenv("CUDA_MPS_PIPE_DIRECTORY"), getenv("CUDA_MPS_CLIENT_PRIORITY"));
}

/* job_sanitize makes the job name one the daemon accepts (PROTOCOL.md,
 * "Limits": valid UTF-8, no control characters) in place: a character cut by
 * the 255-byte truncation is dropped, a byte that starts no valid UTF-8
 * character becomes '?', a control character (C0, DEL, C1) becomes '_'. */
static void job_sanitize(char *s)
{
	unsigned char *in = (unsigned char *)s, *out = (unsigned char *)s;
	while (*in) {
		unsigned c = *in, cp, n;
		if (c < 0x80) {
			*out++ = c < 0x20 || c == 0x7f ? '_' : (unsigned char)c;
			in++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 2, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			n = 3, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 4, cp = c & 0x07;
		else
			n = 0, cp = 0;
		unsigned k = 1;
		for (; n && k < n && (in[k] & 0xc0) == 0x80; k++)
			cp = cp << 6 | (in[k] & 0x3f);
		if (n && k < n && in[k] == 0)
			break; /* cut by the truncation: drop it */
		if (!n || k < n || (n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
		    (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
			*out++ = '?';
			in++;
			continue;
		}
		if (cp >= 0x80 && cp <= 0x9f) {
			*out++ = '_';
		} else {
			memmove(out, in, n);
			out += n;
		}
		in += n;
	}
	*out = 0;
}

int ms_control_connect(void)
{
	const char *path = socket_path();
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof sa.sun_path)
		return 0;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		ms_log("no daemon at %s (%s): passthrough", path, strerror(errno));
		close(fd);
		return 0;
	}
	sock_fd = fd;
	rlen = 0;

	char job[256], jobq[600], dev[64], m[MAXLINE];
	const char *j = getenv("MIGSWAP_JOB");
	if (j && *j)
		snprintf(job, sizeof job, "%s", j);
	else
		snprintf(job, sizeof job, "pid-%d", (int)getpid());
	job_sanitize(job);
	json_escape(job, jobq, sizeof jobq);
	const char *pr = getenv("MIGSWAP_PRIORITY");
	long prio = pr ? strtol(pr, NULL, 10) : 0;
	device_name(dev, sizeof dev);
	snprintf(m, sizeof m,
		 "{\"type\":\"hello\",\"version\":1,\"pid\":%d,\"job\":%s,\"priority\":%ld,\"device\":\"%s\",\"bytes\":%llu}",
		 (int)getpid(), jobq, prio, dev, (unsigned long long)atomic_load(&ms_live_bytes));
	char line[MAXLINE], type[64];
	if (send_line(m) != 0 || read_line(line, sizeof line, 2000) != 1 || json_str(line, "type", type, sizeof type) != 0 ||
	    strcmp(type, "welcome") != 0) {
		ms_log("daemon at %s did not welcome us: passthrough", path);
		close(fd);
		sock_fd = -1;
		return 0;
	}
	atomic_store(&connected, 1);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&ctl_thread, NULL, control_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		atomic_store(&connected, 0);
		close(fd);
		sock_fd = -1;
		return 0;
	}
	pthread_detach(ctl_thread);
	return 1;
}

int ms_control_need(uint64_t bytes)
{
	if (!atomic_load(&connected))
		return 0;
	pthread_mutex_lock(&need_serial);
	pthread_mutex_lock(&need_mu);
	long id = ++need_seq;
	need_waiting = id;
	need_answer = 0;
	pthread_mutex_unlock(&need_mu);
	char m[160];
	snprintf(m, sizeof m, "{\"type\":\"need\",\"id\":%ld,\"bytes\":%llu}", id, (unsigned long long)bytes);
	MS_STAT_ADD(needs, 1);
	int ans = 2;
	if (send_line(m) == 0) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 120;
		pthread_mutex_lock(&need_mu);
		while (need_answer == 0 && atomic_load(&connected))
			if (pthread_cond_timedwait(&need_cv, &need_mu, &dl) != 0)
				break;
		ans = need_answer ? need_answer : 2;
		need_waiting = 0;
		pthread_mutex_unlock(&need_mu);
	}
	pthread_mutex_unlock(&need_serial);
	ms_log("need %ld (%llu bytes): %s", id, (unsigned long long)bytes, ans == 1 ? "granted" : "denied");
	return ans == 1;
}

void ms_control_atfork_prepare(void)
{
	pthread_mutex_lock(&need_mu);
	pthread_mutex_lock(&write_mu);
}

void ms_control_atfork_parent(void)
{
	pthread_mutex_unlock(&write_mu);
	pthread_mutex_unlock(&need_mu);
}

void ms_control_atfork_child(void)
{
	pthread_mutex_init(&write_mu, NULL);
	pthread_mutex_init(&need_mu, NULL);
	pthread_mutex_init(&need_serial, NULL);
	pthread_cond_init(&need_cv, NULL);
	if (sock_fd >= 0)
		close(sock_fd); /* the parent's connection: never ours */
	sock_fd = -1;
	if (pending_fd >= 0)
		close(pending_fd);
	pending_fd = -1;
	rlen = 0;
	atomic_store(&connected, 0);
	atomic_store(&usage_dirty, 0);
	need_waiting = 0;
	need_answer = 0;
}
