/*
 * ptxslice.c — the PTX rewriter, slice plans, the sliced launch and the
 * shim's module/function/launch hooks for slicing. See ptxslice.h.
 *
 * The rewriter is a small PTX lexer and a statement-level parser, enough to
 * find every .entry and .func with its parameter list and body, every read of
 * a special register, and every call. It never guesses: an entry with a use of
 * %ctaid/%nctaid in a form it does not know, or that reaches code it cannot
 * see, is left as it was and gets a reason.
 *
 * Built into libmigswap.so; built with -DMS_SLICE_PURE (no driver, no shim
 * state) into the test program for the rewriter and the plans.
 */
#define _GNU_SOURCE
#include "ptxslice.h"
#ifndef MS_SLICE_PURE
#include "internal.h"
#endif

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================== lexer */

enum { T_IDENT, T_DIR, T_NUM, T_STR, T_PUNCT };

struct tok {
	int kind;
	size_t s, e; /* [s, e) in the text */
};

struct lexer {
	const char *p;
	size_t n;
	struct tok *t;
	size_t nt, cap;
};

static int idchar(int c)
{
	return isalnum(c) || c == '_' || c == '$';
}

static int push_tok(struct lexer *L, int kind, size_t s, size_t e)
{
	if (L->nt == L->cap) {
		size_t nc = L->cap ? L->cap * 2 : 4096;
		struct tok *nt = realloc(L->t, nc * sizeof *nt);
		if (!nt)
			return -1;
		L->t = nt;
		L->cap = nc;
	}
	L->t[L->nt++] = (struct tok){ kind, s, e };
	return 0;
}

static int lex(struct lexer *L, char *reason, size_t rlen)
{
	const char *p = L->p;
	size_t n = L->n, i = 0;
	while (i < n) {
		unsigned char c = (unsigned char)p[i];
		if (c == 0)
			break;
		if (isspace(c)) {
			i++;
			continue;
		}
		if (c == '/' && i + 1 < n && p[i + 1] == '/') {
			while (i < n && p[i] != '\n')
				i++;
			continue;
		}
		if (c == '/' && i + 1 < n && p[i + 1] == '*') {
			size_t j = i + 2;
			while (j + 1 < n && !(p[j] == '*' && p[j + 1] == '/'))
				j++;
			if (j + 1 >= n) {
				snprintf(reason, rlen, "unterminated comment");
				return -1;
			}
			i = j + 2;
			continue;
		}
		size_t s = i;
		int kind;
		if (c == '"') {
			i++;
			while (i < n && p[i] != '"' && p[i] != '\n') {
				if (p[i] == '\\' && i + 1 < n)
					i++;
				i++;
			}
			if (i >= n || p[i] != '"') {
				snprintf(reason, rlen, "unterminated string");
				return -1;
			}
			i++;
			kind = T_STR;
		} else if ((c == '%' || c == '_' || c == '$' || isalpha(c)) && (c != '%' || (i + 1 < n && idchar((unsigned char)p[i + 1])))) {
			i++;
			while (i < n && idchar((unsigned char)p[i]))
				i++;
			kind = T_IDENT;
		} else if (c == '.' && i + 1 < n && idchar((unsigned char)p[i + 1])) {
			i++;
			while (i < n && idchar((unsigned char)p[i]))
				i++;
			kind = T_DIR;
		} else if (isdigit(c)) {
			i++;
			while (i < n && (idchar((unsigned char)p[i]) || p[i] == '.'))
				i++;
			kind = T_NUM;
		} else {
			i++;
			kind = T_PUNCT;
		}
		if (push_tok(L, kind, s, i) != 0) {
			snprintf(reason, rlen, "out of memory");
			return -1;
		}
	}
	return 0;
}

/* ========================================================= parser helpers */

struct rw {
	const char *p;
	struct tok *t;
	size_t nt;
};

static int tis(const struct rw *R, size_t i, const char *s)
{
	if (i >= R->nt)
		return 0;
	size_t l = R->t[i].e - R->t[i].s;
	return strlen(s) == l && memcmp(R->p + R->t[i].s, s, l) == 0;
}

static int tpunct(const struct rw *R, size_t i, char c)
{
	return i < R->nt && R->t[i].kind == T_PUNCT && R->p[R->t[i].s] == c;
}

static int tprefix(const struct rw *R, size_t i, const char *s)
{
	size_t l = strlen(s);
	return i < R->nt && R->t[i].e - R->t[i].s >= l && memcmp(R->p + R->t[i].s, s, l) == 0;
}

/* adjacent: token i+1 starts where token i ends (dotted opcode parts) */
static int adjacent(const struct rw *R, size_t i)
{
	return i + 1 < R->nt && R->t[i + 1].s == R->t[i].e;
}

static char *tdup(const struct rw *R, size_t i)
{
	return strndup(R->p + R->t[i].s, R->t[i].e - R->t[i].s);
}

/* match returns the index of the token closing the bracket opened at i. */
static size_t match(const struct rw *R, size_t i, size_t end)
{
	char open = R->p[R->t[i].s], close = open == '(' ? ')' : open == '[' ? ']' : '}';
	int d = 0;
	for (size_t j = i; j < end; j++) {
		if (tpunct(R, j, open))
			d++;
		else if (tpunct(R, j, close) && --d == 0)
			return j;
	}
	return (size_t)-1;
}

/* line_end returns the first token at or after i that starts on a later line
 * than token i. */
static size_t line_end(const struct rw *R, size_t i)
{
	size_t j = i + 1;
	for (; j < R->nt; j++) {
		if (memchr(R->p + R->t[i].s, '\n', R->t[j].s - R->t[i].s))
			break;
	}
	return j;
}

/* ======================================================== the module model */

struct call {
	char *name; /* NULL: indirect */
};

struct fn {
	int is_entry;
	char *name;
	size_t name_tok;
	size_t lparen, rparen; /* parameter list, (size_t)-1 when absent */
	size_t body_open, body_close;
	int grid_reads;      /* %ctaid/%nctaid reads in the body */
	char bad[200];       /* a reason this body can never run sliced */
	struct call *calls;
	size_t ncalls;
	/* for .func: does it (or a callee) read the grid or do a bad thing */
	int taint;
	char taint_reason[200];
};

struct decl { /* a .func declared without a body (.extern) */
	char *name;
};

struct edit {
	size_t pos, del;
	char *ins;
};

struct edits {
	struct edit *v;
	size_t n, cap;
};

static int add_edit(struct edits *E, size_t pos, size_t del, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int add_edit(struct edits *E, size_t pos, size_t del, const char *fmt, ...)
{
	if (E->n == E->cap) {
		size_t nc = E->cap ? E->cap * 2 : 64;
		struct edit *nv = realloc(E->v, nc * sizeof *nv);
		if (!nv)
			return -1;
		E->v = nv;
		E->cap = nc;
	}
	char *s = NULL;
	va_list ap;
	va_start(ap, fmt);
	int r = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (r < 0)
		return -1;
	E->v[E->n++] = (struct edit){ pos, del, s };
	return 0;
}

static void free_edits(struct edits *E)
{
	for (size_t i = 0; i < E->n; i++)
		free(E->v[i].ins);
	free(E->v);
	memset(E, 0, sizeof *E);
}

/* special registers that make a kernel unsliceable, and why */
static const char *bad_sreg(const struct rw *R, size_t i)
{
	static const struct {
		const char *name;
		const char *why;
	} bad[] = {
		{ "%clusterid", "reads %clusterid (thread block clusters)" },
		{ "%nclusterid", "reads %nclusterid (thread block clusters)" },
		{ "%cluster_ctaid", "reads %cluster_ctaid (thread block clusters)" },
		{ "%cluster_nctaid", "reads %cluster_nctaid (thread block clusters)" },
		{ "%cluster_ctarank", "reads %cluster_ctarank (thread block clusters)" },
		{ "%cluster_nctarank", "reads %cluster_nctarank (thread block clusters)" },
		{ "%is_explicit_cluster", "reads %is_explicit_cluster (thread block clusters)" },
		{ "%gridid", "reads %gridid (differs per slice)" },
	};
	if (R->t[i].kind != T_IDENT || R->p[R->t[i].s] != '%')
		return NULL;
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
		if (tis(R, i, bad[k].name))
			return bad[k].why;
	if (tprefix(R, i, "%envreg"))
		return "reads %envreg (driver state of cooperative launches)";
	return NULL;
}

static int is_grid_sreg(const struct rw *R, size_t i)
{
	return tis(R, i, "%ctaid") || tis(R, i, "%nctaid");
}

/* extern functions whose bodies the driver provides and that do not depend on
 * the grid */
static int harmless_extern(const char *name)
{
	static const char *ok[] = { "vprintf", "malloc", "free", "__assertfail" };
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		if (strcmp(name, ok[i]) == 0)
			return 1;
	return 0;
}

static const char *extern_why(const char *name)
{
	if (strncmp(name, "cudaLaunchDevice", 16) == 0 || strncmp(name, "cudaGetParameterBuffer", 22) == 0 ||
	    strncmp(name, "cudaDeviceSynchronize", 21) == 0 || strncmp(name, "cudaStream", 10) == 0)
		return "dynamic parallelism";
	if (strncmp(name, "cudaCG", 6) == 0)
		return "cooperative groups (grid or multi-grid sync)";
	return "its body is not in this module";
}

/* ------------------------------------------------------------- parameters */

static int type_size(const struct rw *R, size_t i)
{
	static const struct {
		const char *t;
		int sz;
	} ty[] = {
		{ ".b8", 1 },      { ".u8", 1 },      { ".s8", 1 },      { ".b16", 2 },   { ".u16", 2 },
		{ ".s16", 2 },     { ".f16", 2 },     { ".bf16", 2 },    { ".b32", 4 },   { ".u32", 4 },
		{ ".s32", 4 },     { ".f32", 4 },     { ".f16x2", 4 },   { ".bf16x2", 4 }, { ".b64", 8 },
		{ ".u64", 8 },     { ".s64", 8 },     { ".f64", 8 },     { ".b128", 16 }, { ".texref", 8 },
		{ ".samplerref", 8 }, { ".surfref", 8 },
	};
	for (size_t k = 0; k < sizeof ty / sizeof ty[0]; k++)
		if (tis(R, i, ty[k].t))
			return ty[k].sz;
	return 0;
}

/* parse_params lays out the parameter list (lp, rp) as the driver does;
 * returns the count or -1 with a reason. */
static int parse_params(const struct rw *R, size_t lp, size_t rp, uint32_t *bytes, char *why, size_t wl)
{
	uint64_t off = 0;
	int count = 0;
	size_t i = lp + 1;
	while (i < rp) {
		size_t j = i;
		int depth = 0;
		while (j < rp && !(depth == 0 && tpunct(R, j, ','))) {
			if (tpunct(R, j, '['))
				depth++;
			if (tpunct(R, j, ']'))
				depth--;
			j++;
		}
		/* one parameter: [i, j) */
		uint64_t align = 0, size = 0, mult = 1;
		int ptr = 0, seen_param = 0, vec = 1;
		for (size_t k = i; k < j; k++) {
			if (tis(R, k, ".param")) {
				seen_param = 1;
			} else if (tis(R, k, ".ptr")) {
				ptr = 1;
			} else if (tis(R, k, ".align")) {
				if (k + 1 >= j || R->t[k + 1].kind != T_NUM) {
					snprintf(why, wl, "cannot read .align in the parameter list");
					return -1;
				}
				if (!ptr)
					align = strtoull(R->p + R->t[k + 1].s, NULL, 0);
				k++;
			} else if (tis(R, k, ".v2")) {
				vec = 2;
			} else if (tis(R, k, ".v4")) {
				vec = 4;
			} else if (R->t[k].kind == T_DIR && type_size(R, k)) {
				size = (uint64_t)type_size(R, k);
			} else if (tpunct(R, k, '[')) {
				if (k + 2 < j && R->t[k + 1].kind == T_NUM && tpunct(R, k + 2, ']')) {
					mult *= strtoull(R->p + R->t[k + 1].s, NULL, 0);
					k += 2;
				} else {
					snprintf(why, wl, "cannot read an array size in the parameter list");
					return -1;
				}
			}
		}
		if (!seen_param || size == 0) {
			snprintf(why, wl, "cannot read parameter %d", count);
			return -1;
		}
		size *= (uint64_t)vec;
		if (!align)
			align = size;
		if (align & (align - 1)) {
			snprintf(why, wl, "parameter %d has alignment %llu", count, (unsigned long long)align);
			return -1;
		}
		off = (off + align - 1) / align * align + size * mult;
		count++;
		i = j + 1;
	}
	if (off > 1u << 20) {
		snprintf(why, wl, "parameters too large");
		return -1;
	}
	*bytes = (uint32_t)off;
	return count;
}

/* ---------------------------------------------------------- body analysis */

struct body_ctx {
	const struct rw *R;
	struct fn *f;
	struct edits *E; /* NULL for .func: analysis only */
	int ctaid_reads, nctaid_reads;
	size_t insert_at; /* text offset for the prologue, (size_t)-1 until found */
	char why[200];    /* first reason to refuse */
};

static void refuse(struct body_ctx *B, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(struct body_ctx *B, const char *fmt, ...)
{
	if (B->why[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(B->why, sizeof B->why, fmt, ap);
	va_end(ap);
}

static void stmt_text(const struct rw *R, size_t a, size_t b, char *out, size_t ol)
{
	size_t s = R->t[a].s, e = R->t[b].e, l = e - s;
	if (l > ol - 1)
		l = ol - 1;
	memcpy(out, R->p + s, l);
	out[l] = 0;
	for (char *c = out; *c; c++)
		if (*c == '\n' || *c == '\t')
			*c = ' ';
}

static const char *comp_name(int comp)
{
	return comp == 0 ? "x" : comp == 1 ? "y" : "z";
}

/* rewrite_vector handles `[@p] mov.vN.{u32,b32,s32} {d0,...}, %ctaid|%nctaid;`:
 * the statement stays and is followed by the adjustment of each component. */
static int rewrite_vector(struct body_ctx *B, size_t a, size_t op, size_t semi, size_t sreg, int is_n)
{
	const struct rw *R = B->R;
	char pred[64] = "";
	if (op > a) {
		size_t l = R->t[op - 1].e - R->t[a].s;
		if (l >= sizeof pred)
			return -1;
		memcpy(pred, R->p + R->t[a].s, l);
		pred[l] = 0;
	}
	size_t k = op + 1;
	int n = 0, is32 = 0;
	while (k < semi && R->t[k].kind == T_DIR) {
		if (tis(R, k, ".v2"))
			n = 2;
		else if (tis(R, k, ".v4"))
			n = 4;
		else if (tis(R, k, ".u32") || tis(R, k, ".b32") || tis(R, k, ".s32"))
			is32 = 1;
		k++;
	}
	if (!tis(R, op, "mov") || !n || !is32 || !tpunct(R, k, '{'))
		return -1;
	size_t d[4] = { 0 };
	int nd = 0;
	size_t close = match(R, k, semi);
	if (close == (size_t)-1)
		return -1;
	for (size_t j = k + 1; j < close; j++) {
		if (tpunct(R, j, ','))
			continue;
		if (R->t[j].kind != T_IDENT || nd == 4)
			return -1;
		d[nd++] = j;
	}
	if (nd != n || !tpunct(R, close + 1, ',') || close + 2 != sreg || sreg + 1 != semi)
		return -1;
	char buf[1024];
	size_t bl = 0;
	for (int c = 0; c < n && c < 3; c++) {
		if (tis(R, d[c], "_"))
			continue;
		int l = (int)(R->t[d[c]].e - R->t[d[c]].s);
		const char *dn = R->p + R->t[d[c]].s;
		if (is_n)
			bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "\n\t%s mov.u32 \t%.*s, %%__ms_nctaid_%s;", pred, l, dn,
					       comp_name(c));
		else
			bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "\n\t%s add.u32 \t%.*s, %.*s, %%__ms_o%s;", pred, l, dn, l,
					       dn, comp_name(c));
		if (bl >= sizeof buf)
			return -1;
	}
	if (is_n)
		B->nctaid_reads++;
	else
		B->ctaid_reads++;
	return add_edit(B->E, R->t[semi].e, 0, "%s", buf);
}

/* rewrite_scalar replaces %ctaid.c / %nctaid.c (tokens sreg, sreg+1) in the
 * instruction with our register, when the instruction's type allows it. */
static int rewrite_scalar(struct body_ctx *B, size_t a, size_t op, size_t semi, size_t sreg, int is_n, int comp)
{
	const struct rw *R = B->R;
	/* the instruction's type suffixes */
	int has32 = 0, has16 = 0, ntypes = 0, last32 = 0, last16 = 0;
	size_t k = op;
	while (adjacent(R, k) && R->t[k + 1].kind == T_DIR) {
		k++;
		int sz = type_size(R, k);
		if (sz) {
			ntypes++;
			int i32 = tis(R, k, ".u32") || tis(R, k, ".s32") || tis(R, k, ".b32");
			int i16 = tis(R, k, ".u16") || tis(R, k, ".s16") || tis(R, k, ".b16");
			has32 |= i32;
			has16 |= i16;
			last32 = i32;
			last16 = i16;
		}
	}
	size_t type_end = k;
	int is_mov = tis(R, op, "mov"), is_cvt = tis(R, op, "cvt");
	int retype = 0;
	if (is_mov && ntypes == 1 && has32) {
		/* mov.u32 d, %ctaid.x */
	} else if (is_mov && ntypes == 1 && has16) {
		retype = 1; /* legacy 16-bit read: cvt.u16.u32 d, ours */
	} else if (is_cvt && ntypes == 2 && last32) {
		/* cvt.u64.u32 d, %ctaid.x */
	} else if (!is_mov && !is_cvt && has32 && !has16) {
		/* add.u32 d, %ctaid.x, r and the like: a .b32 register fits where the
		 * .u32 special register did */
	} else {
		(void)last16;
		char st[160];
		stmt_text(R, a, semi, st, sizeof st);
		refuse(B, "unsupported read of %s: %s", is_n ? "%nctaid" : "%ctaid", st);
		return 0;
	}
	if (retype && add_edit(B->E, R->t[op].s, R->t[type_end].e - R->t[op].s, "cvt.u16.u32") != 0)
		return -1;
	if (is_n) {
		B->nctaid_reads++;
		return add_edit(B->E, R->t[sreg].s, R->t[sreg + 1].e - R->t[sreg].s, "%%__ms_nctaid_%s", comp_name(comp));
	}
	B->ctaid_reads++;
	return add_edit(B->E, R->t[sreg].s, R->t[sreg + 1].e - R->t[sreg].s, "%%__ms_ctaid_%s", comp_name(comp));
}

/* statement [a, semi]: look at special registers and calls */
static int do_stmt(struct body_ctx *B, size_t a, size_t semi)
{
	const struct rw *R = B->R;
	size_t op = a;
	if (tpunct(R, op, '@')) {
		op++;
		if (tpunct(R, op, '!'))
			op++;
		op++; /* the predicate register */
	}
	int is_decl = R->t[a].kind == T_DIR;
	if (!is_decl && B->insert_at == (size_t)-1)
		B->insert_at = R->t[a].s;
	for (size_t i = a; i <= semi; i++) {
		const char *why = bad_sreg(R, i);
		if (why) {
			refuse(B, "%s", why);
			continue;
		}
		if (!is_grid_sreg(R, i))
			continue;
		int is_n = tis(R, i, "%nctaid");
		B->f->grid_reads++;
		if (!B->E)
			continue; /* a .func: the caller decides */
		if (is_decl) {
			refuse(B, "%s in a declaration", is_n ? "%nctaid" : "%ctaid");
			continue;
		}
		int r;
		if (adjacent(R, i) && R->t[i + 1].kind == T_DIR) {
			int comp = tis(R, i + 1, ".x") ? 0 : tis(R, i + 1, ".y") ? 1 : tis(R, i + 1, ".z") ? 2 : -1;
			if (comp < 0) {
				char st[160];
				stmt_text(R, a, semi, st, sizeof st);
				refuse(B, "unknown component of a grid register: %s", st);
				continue;
			}
			r = rewrite_scalar(B, a, op, semi, i, is_n, comp);
			i++;
		} else {
			r = rewrite_vector(B, a, op, semi, i, is_n);
			if (r > 0 || r < 0) {
				char st[160];
				stmt_text(R, a, semi, st, sizeof st);
				refuse(B, "unsupported vector read: %s", st);
				r = 0;
			}
		}
		if (r < 0)
			return -1;
	}
	if (!is_decl && tis(R, op, "call")) {
		size_t k = op + 1;
		while (k < semi && R->t[k].kind == T_DIR)
			k++;
		if (tpunct(R, k, '(')) {
			size_t c = match(R, k, semi + 1);
			if (c == (size_t)-1) {
				refuse(B, "cannot read a call");
				return 0;
			}
			k = c + 1;
			if (tpunct(R, k, ','))
				k++;
		}
		struct call cl = { NULL };
		if (k < semi && R->t[k].kind == T_IDENT && R->p[R->t[k].s] != '%')
			cl.name = tdup(R, k);
		struct call *nc = realloc(B->f->calls, (B->f->ncalls + 1) * sizeof *nc);
		if (!nc)
			return -1;
		B->f->calls = nc;
		B->f->calls[B->f->ncalls++] = cl;
	}
	return 0;
}

/* analyse_body walks the statements of f's body. */
static int analyse_body(struct body_ctx *B)
{
	const struct rw *R = B->R;
	struct fn *f = B->f;
	size_t st = f->body_open + 1;
	B->insert_at = (size_t)-1;
	for (size_t j = st; j < f->body_close; j++) {
		if (j == st) {
			if (tpunct(R, j, '{') || tpunct(R, j, '}')) {
				if (B->insert_at == (size_t)-1)
					B->insert_at = R->t[j].s;
				st = j + 1;
				continue;
			}
			if (tis(R, j, ".loc") || tis(R, j, ".file")) {
				size_t e = line_end(R, j);
				j = e - 1;
				st = e;
				continue;
			}
		}
		if (tpunct(R, j, ';')) {
			if (do_stmt(B, st, j) != 0)
				return -1;
			st = j + 1;
		} else if (tpunct(R, j, ':') && j == st + 1 && R->t[st].kind == T_IDENT) {
			if (B->insert_at == (size_t)-1)
				B->insert_at = R->t[st].s;
			st = j + 1;
		}
	}
	if (st < f->body_close)
		refuse(B, "unterminated statement at the end of the body");
	if (B->insert_at == (size_t)-1)
		B->insert_at = R->t[f->body_close].s;
	return 0;
}

/* ============================================================ idempotence */

/* Address classes beyond the 61 parameter bits. */
#define IB_SHARED (1ULL << 61)
#define IB_LOCAL (1ULL << 62)
#define IB_GLOBAL (1ULL << 63) /* module globals, or an address from no parameter */
#define IB_SCRATCH (IB_SHARED | IB_LOCAL)

struct regmap {
	const char *p;
	struct tok *key; /* tokens; NULL: empty */
	uint64_t *mask;
	size_t cap;
};

static uint64_t *regmap_get(struct regmap *m, const struct tok *t)
{
	size_t l = t->e - t->s;
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < l; i++)
		h = (h ^ (unsigned char)m->p[t->s + i]) * 1099511628211ULL;
	for (size_t n = 0, i = h & (m->cap - 1); n < m->cap; n++, i = (i + 1) & (m->cap - 1)) {
		if (!m->key[i].e) {
			m->key[i] = *t;
			return &m->mask[i];
		}
		if (m->key[i].e - m->key[i].s == l && memcmp(m->p + m->key[i].s, m->p + t->s, l) == 0)
			return &m->mask[i];
	}
	return NULL;
}

struct varclass { /* a named variable of the module or body and its class bit */
	size_t tok;
	uint64_t bit;
};

struct idem {
	const struct rw *R;
	struct regmap regs;
	const size_t *pnames; /* parameter name tokens */
	const int *pptr;      /* the parameter can hold a pointer (at least 8 bytes) */
	int np;
	const struct varclass *vars;
	size_t nvars;
	uint64_t W, Rd;
	char why[120];
	int changed;
};

/* mask of one operand token: a register, a parameter or a variable name */
static uint64_t tok_mask(struct idem *I, size_t t)
{
	const struct rw *R = I->R;
	if (R->t[t].kind != T_IDENT)
		return 0;
	if (R->p[R->t[t].s] == '%') {
		uint64_t *m = regmap_get(&I->regs, &R->t[t]);
		return m ? *m : ~0ULL;
	}
	for (int k = 0; k < I->np; k++) {
		size_t pn = I->pnames[k];
		if (R->t[pn].e - R->t[pn].s == R->t[t].e - R->t[t].s &&
		    memcmp(R->p + R->t[pn].s, R->p + R->t[t].s, R->t[t].e - R->t[t].s) == 0)
			return I->pptr[k] ? 1ULL << (k < 61 ? k : 60) : 0; /* an integer is no address */
	}
	for (size_t v = 0; v < I->nvars; v++) {
		size_t vt = I->vars[v].tok;
		if (R->t[vt].e - R->t[vt].s == R->t[t].e - R->t[t].s &&
		    memcmp(R->p + R->t[vt].s, R->p + R->t[t].s, R->t[t].e - R->t[t].s) == 0)
			return I->vars[v].bit;
	}
	return 0; /* a label, a function name, a type-less name */
}

static uint64_t range_mask(struct idem *I, size_t a, size_t b)
{
	uint64_t m = 0;
	for (size_t t = a; t < b; t++)
		m |= tok_mask(I, t);
	return m;
}

/* the address an operand [a, b) names: a bracket's registers and names */
static uint64_t addr_mask(struct idem *I, size_t a, size_t b)
{
	uint64_t m = range_mask(I, a, b);
	return m ? m : IB_GLOBAL;
}

static void idem_unproven(struct idem *I, const char *fmt, size_t a, size_t b)
{
	if (I->why[0])
		return;
	char st[64];
	stmt_text(I->R, a, b, st, sizeof st);
	snprintf(I->why, sizeof I->why, fmt, st);
}

static int has_dir(const struct rw *R, size_t op, size_t end, const char *d)
{
	for (size_t k = op + 1; k < end && R->t[k].kind == T_DIR && R->t[k].s == R->t[k - 1].e; k++)
		if (tis(R, k, d))
			return 1;
	return 0;
}

static void idem_stmt(struct idem *I, size_t a, size_t semi)
{
	const struct rw *R = I->R;
	size_t op = a;
	if (R->t[a].kind == T_DIR)
		return; /* a declaration */
	if (tpunct(R, op, '@')) {
		op++;
		if (tpunct(R, op, '!'))
			op++;
		op++;
	}
	if (op >= semi || R->t[op].kind != T_IDENT)
		return;
	size_t k = op + 1;
	while (k < semi && R->t[k].kind == T_DIR && R->t[k].s == R->t[k - 1].e)
		k++;
	/* operands: top-level comma-separated ranges */
	size_t os[16], oe[16];
	int no = 0, depth = 0;
	size_t start = k;
	for (size_t t = k; t <= semi && no < 16; t++) {
		if (t < semi && (tpunct(R, t, '[') || tpunct(R, t, '{') || tpunct(R, t, '(')))
			depth++;
		else if (t < semi && (tpunct(R, t, ']') || tpunct(R, t, '}') || tpunct(R, t, ')')))
			depth--;
		else if (t == semi || (depth == 0 && tpunct(R, t, ','))) {
			if (t > start) {
				os[no] = start;
				oe[no] = t;
				no++;
			}
			start = t + 1;
		}
	}
	int gsp = has_dir(R, op, semi, ".global"), shared = has_dir(R, op, semi, ".shared"),
	    local = has_dir(R, op, semi, ".local"), param = has_dir(R, op, semi, ".param"),
	    cnst = has_dir(R, op, semi, ".const");
	int generic = !gsp && !shared && !local && !param && !cnst;
	uint64_t srcs = 0, dst_add = 0;
	int has_dst = 0;
	if (tis(R, op, "ld") || tis(R, op, "ldu")) {
		if (no < 2)
			return idem_unproven(I, "cannot read a load: %s", a, semi);
		uint64_t am = range_mask(I, os[1], oe[1]);
		if (param) {
			dst_add = am; /* a parameter's value: a pointer parameter's bit */
		} else {
			if (gsp || generic)
				I->Rd |= am ? am : IB_GLOBAL;
			dst_add = IB_GLOBAL; /* a value from memory: where it points is unknown */
		}
		has_dst = 1;
	} else if (tis(R, op, "st")) {
		if (has_dir(R, op, semi, ".async"))
			return idem_unproven(I, "an asynchronous store: %s", a, semi);
		if (no < 1)
			return idem_unproven(I, "cannot read a store: %s", a, semi);
		if (gsp || generic)
			I->W |= addr_mask(I, os[0], oe[0]);
		return;
	} else if (tis(R, op, "atom") || tis(R, op, "red")) {
		if (shared)
			return;
		return idem_unproven(I, "an atomic read-modify-write of global memory: %s", a, semi);
	} else if (tis(R, op, "cp")) {
		int mem = 0;
		for (size_t t = k; t < semi; t++)
			mem |= tpunct(R, t, '[');
		if (!mem)
			return; /* cp.async.commit_group, cp.async.wait_group N, ... */
		if (has_dir(R, op, semi, ".async") && shared && gsp && no >= 2 && !has_dir(R, op, semi, ".bulk")) {
			I->Rd |= addr_mask(I, os[1], oe[1]); /* global -> shared */
			return;
		}
		if (gsp || generic)
			return idem_unproven(I, "a copy form not analysed: %s", a, semi);
		return;
	} else if (tis(R, op, "call")) {
		size_t c = op + 1;
		while (c < semi && R->t[c].kind == T_DIR)
			c++;
		if (tpunct(R, c, '(')) {
			size_t m = match(R, c, semi + 1);
			c = m == (size_t)-1 ? semi : m + 1;
			if (tpunct(R, c, ','))
				c++;
		}
		char name[64] = "";
		if (c < semi && R->t[c].kind == T_IDENT && R->p[R->t[c].s] != '%') {
			size_t l = R->t[c].e - R->t[c].s;
			snprintf(name, sizeof name, "%.*s", (int)(l < 63 ? l : 63), R->p + R->t[c].s);
		}
		if (!name[0] || !harmless_extern(name))
			return idem_unproven(I, "a call whose callee is not analysed: %s", a, semi);
		return;
	} else if (tis(R, op, "sust") || tis(R, op, "sured") || tis(R, op, "suatom") || tis(R, op, "multimem") ||
		   tis(R, op, "tensormap") || tis(R, op, "cp.async")) {
		return idem_unproven(I, "a memory operation not analysed: %s", a, semi);
	} else if (no >= 1 && tpunct(R, os[0], '[')) {
		if (tis(R, op, "prefetch") || tis(R, op, "prefetchu") || tis(R, op, "applypriority") ||
		    tis(R, op, "discard") || tis(R, op, "createpolicy"))
			return;
		return idem_unproven(I, "a memory operation not analysed: %s", a, semi);
	} else if (no >= 1) {
		has_dst = 1;
	}
	if (!has_dst || no < 1)
		return;
	for (int o = 1; o < no; o++)
		srcs |= range_mask(I, os[o], oe[o]);
	srcs |= dst_add;
	for (size_t t = os[0]; t < oe[0]; t++) {
		if (R->t[t].kind != T_IDENT || R->p[R->t[t].s] != '%')
			continue;
		uint64_t *m = regmap_get(&I->regs, &R->t[t]);
		if (!m)
			return idem_unproven(I, "too many registers: %s", a, semi);
		if ((*m | srcs) != *m) {
			*m |= srcs;
			I->changed = 1;
		}
	}
}

/* entry_idempotence fills e->idempotent / e->idem_reason for entry f. */
static void entry_idempotence(const struct rw *R, const struct fn *f, const struct varclass *vars, size_t nvars,
			      int address_size, struct ms_ptx_entry *e)
{
	struct idem I;
	memset(&I, 0, sizeof I);
	I.R = R;
	I.vars = vars;
	I.nvars = nvars;
	size_t pn[61];
	int pp[61], np = 0;
	if (f->lparen != (size_t)-1) {
		uint64_t bytes = 0, mult = 1;
		for (size_t t = f->lparen + 1; t < f->rparen && np < 61; t++) {
			if (R->t[t].kind == T_DIR && type_size(R, t))
				bytes = (uint64_t)type_size(R, t);
			else if (tpunct(R, t, '[') && t + 1 < f->rparen && R->t[t + 1].kind == T_NUM)
				mult *= strtoull(R->p + R->t[t + 1].s, NULL, 0);
			else if (R->t[t].kind == T_IDENT && (tpunct(R, t + 1, ',') || tpunct(R, t + 1, ')') || tpunct(R, t + 1, '[')))
				pn[np] = t;
			if (tpunct(R, t, ',') || t + 1 == f->rparen) {
				/* 32-bit modules have 4-byte pointers */
				pp[np++] = bytes * mult >= (address_size == 32 ? 4 : 8);
				bytes = 0, mult = 1;
			}
		}
	}
	I.pnames = pn;
	I.pptr = pp;
	I.np = np;
	I.regs.p = R->p;
	I.regs.cap = 1 << 15;
	I.regs.key = calloc(I.regs.cap, sizeof *I.regs.key);
	I.regs.mask = calloc(I.regs.cap, sizeof *I.regs.mask);
	if (!I.regs.key || !I.regs.mask) {
		snprintf(e->idem_reason, sizeof e->idem_reason, "out of memory");
		goto out;
	}
	for (int pass = 0; pass < 64; pass++) {
		I.changed = 0;
		size_t st = f->body_open + 1;
		for (size_t j = st; j < f->body_close && !I.why[0]; j++) {
			if (j == st) {
				if (tpunct(R, j, '{') || tpunct(R, j, '}')) {
					st = j + 1;
					continue;
				}
				if (tis(R, j, ".loc") || tis(R, j, ".file")) {
					size_t le = line_end(R, j);
					j = le - 1;
					st = le;
					continue;
				}
			}
			if (tpunct(R, j, ';')) {
				idem_stmt(&I, st, j);
				st = j + 1;
			} else if (tpunct(R, j, ':') && j == st + 1 && R->t[st].kind == T_IDENT) {
				st = j + 1;
			}
		}
		if (I.why[0] || !I.changed)
			break;
	}
	if (I.why[0]) {
		snprintf(e->idem_reason, sizeof e->idem_reason, "%s", I.why);
		goto out;
	}
	/* IB_GLOBAL is "somewhere in global memory": it meets every other bit */
	uint64_t w = I.W & ~IB_SCRATCH, r = I.Rd & ~IB_SCRATCH, both = w & r;
	if (!both && !((w & IB_GLOBAL) && r) && !((r & IB_GLOBAL) && w)) {
		e->idempotent = 1;
	} else if (!both || (both & IB_GLOBAL)) {
		snprintf(e->idem_reason, sizeof e->idem_reason,
			 "reads or writes global memory through an address no parameter names");
	} else {
		int k = __builtin_ctzll(both);
		snprintf(e->idem_reason, sizeof e->idem_reason, "reads and writes the memory of parameter %d", k);
	}
out:
	free(I.regs.key);
	free(I.regs.mask);
}

/* collect_vars finds the variables the module and its bodies declare:
 * .global (IB_GLOBAL), .shared, .local; .const is read-only (no bit). */
static size_t collect_vars(const struct rw *R, struct varclass **out)
{
	size_t n = 0, cap = 0;
	struct varclass *v = NULL;
	for (size_t i = 0; i < R->nt; i++) {
		uint64_t bit;
		if (tis(R, i, ".global"))
			bit = IB_GLOBAL;
		else if (tis(R, i, ".shared"))
			bit = IB_SHARED;
		else if (tis(R, i, ".local"))
			bit = IB_LOCAL;
		else if (tis(R, i, ".const"))
			bit = 0;
		else
			continue;
		/* only at the start of a declaration (after linkage directives) */
		size_t p = i;
		while (p > 0 && (tis(R, p - 1, ".extern") || tis(R, p - 1, ".visible") || tis(R, p - 1, ".weak") ||
				 tis(R, p - 1, ".common")))
			p--;
		if (p > 0 && !tpunct(R, p - 1, ';') && !tpunct(R, p - 1, '{') && !tpunct(R, p - 1, '}') &&
		    R->t[p - 1].kind != T_NUM && R->t[p - 1].kind != T_STR)
			continue;
		if (p > 0 && (R->t[p - 1].kind == T_NUM || R->t[p - 1].kind == T_STR) &&
		    !memchr(R->p + R->t[p - 1].e, '\n', R->t[i].s - R->t[p - 1].e))
			continue; /* after a directive operand on the same line: not a declaration */
		for (size_t t = i + 1; t < R->nt && !tpunct(R, t, ';') && !tpunct(R, t, '=') && !tpunct(R, t, '['); t++) {
			if (R->t[t].kind == T_IDENT) {
				if (n == cap) {
					cap = cap ? cap * 2 : 64;
					struct varclass *nv = realloc(v, cap * sizeof *nv);
					if (!nv)
						goto done;
					v = nv;
				}
				v[n++] = (struct varclass){ t, bit };
				break;
			}
		}
	}
done:
	*out = v;
	return n;
}

/* ================================================================ rewrite */

static int cmp_edit(const void *a, const void *b)
{
	const struct edit *x = a, *y = b;
	return x->pos < y->pos ? -1 : x->pos > y->pos ? 1 : 0;
}

static int find_fn(struct fn *fns, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!fns[i].is_entry && strcmp(fns[i].name, name) == 0)
			return (int)i;
	return -1;
}

static int has_decl(struct decl *d, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(d[i].name, name) == 0)
			return 1;
	return 0;
}

int ms_ptx_rewrite(const char *ptx, size_t len, struct ms_ptx_module *out)
{
	memset(out, 0, sizeof *out);
	struct lexer L = { ptx, len, NULL, 0, 0 };
	struct fn *fns = NULL;
	size_t nfns = 0;
	struct decl *decls = NULL;
	size_t ndecls = 0;
	struct edits all = { 0 };
	int ret = -1;
	int version_major = 0, version_minor = 0, address_size = 64;
	struct varclass *vars = NULL;
	size_t nvars = 0;

	if (memmem(ptx, len, MS_SLICE_PREFIX, strlen(MS_SLICE_PREFIX))) {
		snprintf(out->reason, sizeof out->reason, "uses the reserved prefix %s (already rewritten?)", MS_SLICE_PREFIX);
		goto done;
	}
	if (lex(&L, out->reason, sizeof out->reason) != 0)
		goto done;
	struct rw R = { ptx, L.t, L.nt };

	/* ---- top level: find functions ---- */
	for (size_t i = 0; i < R.nt;) {
		if (tis(&R, i, ".version") && i + 1 < R.nt) {
			sscanf(ptx + R.t[i + 1].s, "%d.%d", &version_major, &version_minor);
			i = line_end(&R, i);
			continue;
		}
		if (tis(&R, i, ".address_size") && i + 1 < R.nt)
			address_size = atoi(ptx + R.t[i + 1].s);
		if (tis(&R, i, ".target") || tis(&R, i, ".address_size") || tis(&R, i, ".file") || tis(&R, i, ".loc")) {
			i = line_end(&R, i);
			continue;
		}
		if (tis(&R, i, ".section")) {
			size_t j = i;
			while (j < R.nt && !tpunct(&R, j, '{'))
				j++;
			size_t c = j < R.nt ? match(&R, j, R.nt) : (size_t)-1;
			if (c == (size_t)-1) {
				snprintf(out->reason, sizeof out->reason, "unterminated .section");
				goto done;
			}
			i = c + 1;
			continue;
		}
		/* a declaration up to ';' or a function with a body */
		int kind = 0; /* 1 entry, 2 func */
		size_t kw = 0, j = i;
		int paren = 0;
		for (; j < R.nt; j++) {
			if (!kind && tis(&R, j, ".entry")) {
				kind = 1;
				kw = j;
			} else if (!kind && tis(&R, j, ".func")) {
				kind = 2;
				kw = j;
			} else if (tpunct(&R, j, '(')) {
				paren++;
			} else if (tpunct(&R, j, ')')) {
				paren--;
			} else if (paren == 0 && tpunct(&R, j, ';')) {
				break;
			} else if (paren == 0 && tpunct(&R, j, '{')) {
				if (kind)
					break;
				size_t c = match(&R, j, R.nt); /* an initializer */
				if (c == (size_t)-1) {
					snprintf(out->reason, sizeof out->reason, "unbalanced braces");
					goto done;
				}
				j = c;
			}
		}
		if (j >= R.nt) {
			if (kind) {
				snprintf(out->reason, sizeof out->reason, "unterminated function declaration");
				goto done;
			}
			break;
		}
		if (kind) {
			/* name and parameter list */
			size_t k = kw + 1, name = (size_t)-1, lp = (size_t)-1, rp = (size_t)-1;
			if (kind == 2 && tpunct(&R, k, '(')) { /* return parameters */
				size_t c = match(&R, k, j);
				if (c == (size_t)-1) {
					snprintf(out->reason, sizeof out->reason, "cannot read a .func return list");
					goto done;
				}
				k = c + 1;
			}
			if (k < j && R.t[k].kind == T_IDENT)
				name = k++;
			if (name == (size_t)-1) {
				snprintf(out->reason, sizeof out->reason, "a function without a name");
				goto done;
			}
			if (tpunct(&R, k, '(')) {
				lp = k;
				rp = match(&R, k, j);
				if (rp == (size_t)-1) {
					snprintf(out->reason, sizeof out->reason, "cannot read the parameters of %.*s",
						 (int)(R.t[name].e - R.t[name].s), ptx + R.t[name].s);
					goto done;
				}
			}
			if (tpunct(&R, j, ';')) {
				if (kind == 2) {
					struct decl *nd = realloc(decls, (ndecls + 1) * sizeof *nd);
					if (!nd)
						goto done;
					decls = nd;
					decls[ndecls++].name = tdup(&R, name);
				}
				i = j + 1;
				continue;
			}
			size_t close = match(&R, j, R.nt);
			if (close == (size_t)-1) {
				snprintf(out->reason, sizeof out->reason, "unterminated body of %.*s",
					 (int)(R.t[name].e - R.t[name].s), ptx + R.t[name].s);
				goto done;
			}
			struct fn *nf = realloc(fns, (nfns + 1) * sizeof *nf);
			if (!nf)
				goto done;
			fns = nf;
			struct fn *f = &fns[nfns++];
			memset(f, 0, sizeof *f);
			f->is_entry = kind == 1;
			f->name = tdup(&R, name);
			f->name_tok = name;
			f->lparen = lp;
			f->rparen = rp;
			f->body_open = j;
			f->body_close = close;
			/* performance directives between the parameters and the body */
			for (size_t d = (rp != (size_t)-1 ? rp : name) + 1; d < j; d++) {
				if (tis(&R, d, ".explicitcluster") || tis(&R, d, ".reqnctapercluster") ||
				    tis(&R, d, ".maxclusterrank") || tis(&R, d, ".blocksareclusters"))
					snprintf(f->bad, sizeof f->bad, "declared for thread block clusters (%.*s)",
						 (int)(R.t[d].e - R.t[d].s), ptx + R.t[d].s);
			}
			i = close + 1;
			continue;
		}
		i = j + 1;
	}

	/* ---- analyse the .func bodies, then propagate through calls ---- */
	for (size_t i = 0; i < nfns; i++) {
		if (fns[i].is_entry)
			continue;
		struct body_ctx B = { &R, &fns[i], NULL, 0, 0, 0, "" };
		if (analyse_body(&B) != 0)
			goto done;
		if (B.why[0])
			snprintf(fns[i].taint_reason, sizeof fns[i].taint_reason, "calls %s, which %s", fns[i].name, B.why);
		else if (fns[i].grid_reads)
			snprintf(fns[i].taint_reason, sizeof fns[i].taint_reason,
				 "calls %s, which reads %%ctaid/%%nctaid (not rewritten in .func bodies)", fns[i].name);
		fns[i].taint = fns[i].taint_reason[0] != 0;
	}
	for (int changed = 1; changed;) {
		changed = 0;
		for (size_t i = 0; i < nfns; i++) {
			struct fn *f = &fns[i];
			if (f->is_entry || f->taint)
				continue;
			for (size_t c = 0; c < f->ncalls && !f->taint; c++) {
				const char *cn = f->calls[c].name;
				int t = cn ? find_fn(fns, nfns, cn) : -1;
				if (!cn) {
					snprintf(f->taint_reason, sizeof f->taint_reason, "calls %s, which makes an indirect call",
						 f->name);
				} else if (t >= 0 && fns[t].taint) {
					snprintf(f->taint_reason, sizeof f->taint_reason, "calls %.40s, which %.140s",
						 f->name, fns[t].taint_reason);
				} else if (t < 0 && !harmless_extern(cn)) {
					snprintf(f->taint_reason, sizeof f->taint_reason, "calls %s, which calls external %s (%s)",
						 f->name, cn, extern_why(cn));
				}
				if (f->taint_reason[0]) {
					f->taint = 1;
					changed = 1;
				}
			}
		}
	}
	int any_taint = 0;
	for (size_t i = 0; i < nfns; i++)
		any_taint |= !fns[i].is_entry && fns[i].taint;

	/* ---- entries ---- */
	int nent = 0;
	for (size_t i = 0; i < nfns; i++)
		nent += fns[i].is_entry;
	out->entries = calloc((size_t)nent + 1, sizeof *out->entries);
	if (!out->entries)
		goto done;
	nvars = collect_vars(&R, &vars);
	uint32_t limit = (version_major > 8 || (version_major == 8 && version_minor >= 1)) ? 32764 : 4096;
	for (size_t i = 0; i < nfns; i++) {
		struct fn *f = &fns[i];
		if (!f->is_entry)
			continue;
		struct ms_ptx_entry *e = &out->entries[out->nentries++];
		e->name = strdup(f->name);
		entry_idempotence(&R, f, vars, nvars, address_size, e);
		struct edits E = { 0 };
		struct body_ctx B = { &R, f, &E, 0, 0, 0, "" };
		char why[200] = "";
		int np = 0;
		if (f->lparen != (size_t)-1)
			np = parse_params(&R, f->lparen, f->rparen, &e->param_bytes, why, sizeof why);
		if (np >= 0) {
			e->nparams = np;
			e->slice_offset = (e->param_bytes + 3u) & ~3u;
			if (e->slice_offset + sizeof(struct ms_slice_args) > limit)
				snprintf(why, sizeof why, "no room for the slice parameter (%u bytes of %u)", e->param_bytes,
					 limit);
		}
		if (!why[0] && f->bad[0])
			snprintf(why, sizeof why, "%s", f->bad);
		if (!why[0] && analyse_body(&B) != 0) {
			free_edits(&E);
			goto done;
		}
		if (!why[0] && B.why[0])
			snprintf(why, sizeof why, "%s", B.why);
		for (size_t c = 0; !why[0] && c < f->ncalls; c++) {
			const char *cn = f->calls[c].name;
			int t = cn ? find_fn(fns, nfns, cn) : -1;
			if (!cn && any_taint)
				snprintf(why, sizeof why, "makes an indirect call, and a .func of this module reads the grid");
			else if (!cn)
				continue;
			else if (t >= 0 && fns[t].taint)
				snprintf(why, sizeof why, "%s", fns[t].taint_reason);
			else if (t < 0 && !harmless_extern(cn))
				snprintf(why, sizeof why, "calls external %s (%s)%s", cn, extern_why(cn),
					 has_decl(decls, ndecls, cn) ? "" : "; not declared");
		}
		if (why[0]) {
			snprintf(e->reason, sizeof e->reason, "%s", why);
			free_edits(&E);
			continue;
		}
		/* the parameter */
		int ok = 0;
		if (f->lparen == (size_t)-1)
			ok = add_edit(&E, R.t[f->name_tok].e, 0, "(.param .align 4 .b8 " MS_SLICE_PARAM "[24])");
		else if (np == 0)
			ok = add_edit(&E, R.t[f->rparen].s, 0, "\n\t.param .align 4 .b8 " MS_SLICE_PARAM "[24]\n");
		else
			ok = add_edit(&E, R.t[f->rparen - 1].e, 0, ",\n\t.param .align 4 .b8 " MS_SLICE_PARAM "[24]");
		/* declarations right after '{', the prologue before the first instruction */
		if (ok == 0 && (B.ctaid_reads || B.nctaid_reads)) {
			ok = add_edit(&E, R.t[f->body_open].e, 0,
				      "\n\t.reg .b32 \t%%__ms_ox, %%__ms_oy, %%__ms_oz, %%__ms_ctaid_x, %%__ms_ctaid_y, "
				      "%%__ms_ctaid_z, %%__ms_nctaid_x, %%__ms_nctaid_y, %%__ms_nctaid_z;");
			if (ok == 0)
				ok = add_edit(&E, B.insert_at, 0,
					      "// migswap slicing: block offset and original grid from " MS_SLICE_PARAM "\n"
					      "\tld.param.u32 \t%%__ms_ox, [" MS_SLICE_PARAM "];\n"
					      "\tld.param.u32 \t%%__ms_oy, [" MS_SLICE_PARAM "+4];\n"
					      "\tld.param.u32 \t%%__ms_oz, [" MS_SLICE_PARAM "+8];\n"
					      "\tld.param.u32 \t%%__ms_nctaid_x, [" MS_SLICE_PARAM "+12];\n"
					      "\tld.param.u32 \t%%__ms_nctaid_y, [" MS_SLICE_PARAM "+16];\n"
					      "\tld.param.u32 \t%%__ms_nctaid_z, [" MS_SLICE_PARAM "+20];\n"
					      "\tmov.u32 \t%%__ms_ctaid_x, %%ctaid.x;\n"
					      "\tadd.u32 \t%%__ms_ctaid_x, %%__ms_ctaid_x, %%__ms_ox;\n"
					      "\tmov.u32 \t%%__ms_ctaid_y, %%ctaid.y;\n"
					      "\tadd.u32 \t%%__ms_ctaid_y, %%__ms_ctaid_y, %%__ms_oy;\n"
					      "\tmov.u32 \t%%__ms_ctaid_z, %%ctaid.z;\n"
					      "\tadd.u32 \t%%__ms_ctaid_z, %%__ms_ctaid_z, %%__ms_oz;\n"
					      "\t// migswap slicing: end\n\t");
		}
		if (ok != 0) {
			free_edits(&E);
			goto done;
		}
		e->sliceable = 1;
		e->ctaid_reads = B.ctaid_reads;
		e->nctaid_reads = B.nctaid_reads;
		out->nsliceable++;
		for (size_t k = 0; k < E.n; k++) {
			if (all.n == all.cap) {
				size_t nc = all.cap ? all.cap * 2 : 256;
				struct edit *nv = realloc(all.v, nc * sizeof *nv);
				if (!nv) {
					free_edits(&E);
					goto done;
				}
				all.v = nv;
				all.cap = nc;
			}
			all.v[all.n++] = E.v[k];
		}
		free(E.v);
	}

	/* ---- apply the edits ---- */
	if (out->nsliceable) {
		qsort(all.v, all.n, sizeof *all.v, cmp_edit);
		size_t outlen = len;
		for (size_t k = 0; k < all.n; k++)
			outlen += strlen(all.v[k].ins);
		char *o = malloc(outlen + 1), *w = o;
		if (!o)
			goto done;
		size_t at = 0;
		for (size_t k = 0; k < all.n; k++) {
			struct edit *ed = &all.v[k];
			if (ed->pos < at) { /* overlapping edits: a bug, never emit */
				free(o);
				snprintf(out->reason, sizeof out->reason, "internal error: overlapping edits");
				out->nsliceable = 0;
				goto done;
			}
			memcpy(w, ptx + at, ed->pos - at);
			w += ed->pos - at;
			size_t il = strlen(ed->ins);
			memcpy(w, ed->ins, il);
			w += il;
			at = ed->pos + ed->del;
		}
		size_t tail = len - at;
		/* the image may carry a NUL before len: stop there */
		const char *nul = memchr(ptx + at, 0, tail);
		if (nul)
			tail = (size_t)(nul - (ptx + at));
		memcpy(w, ptx + at, tail);
		w += tail;
		*w = 0;
		out->ptx = o;
		out->ptx_len = (size_t)(w - o);
	} else if (!out->reason[0]) {
		snprintf(out->reason, sizeof out->reason, out->nentries ? "no entry could be rewritten" : "no .entry");
	}
	ret = 0;
done:
	if (ret != 0) {
		for (int k = 0; k < out->nentries; k++)
			out->entries[k].sliceable = 0;
		out->nsliceable = 0;
		if (!out->reason[0])
			snprintf(out->reason, sizeof out->reason, "out of memory");
	}
	for (size_t i = 0; i < nfns; i++) {
		free(fns[i].name);
		for (size_t c = 0; c < fns[i].ncalls; c++)
			free(fns[i].calls[c].name);
		free(fns[i].calls);
	}
	free(fns);
	for (size_t i = 0; i < ndecls; i++)
		free(decls[i].name);
	free(decls);
	free_edits(&all);
	free(vars);
	free(L.t);
	return ret;
}

void ms_ptx_module_free(struct ms_ptx_module *m)
{
	if (!m)
		return;
	free(m->ptx);
	for (int i = 0; i < m->nentries; i++)
		free(m->entries[i].name);
	free(m->entries);
	memset(m, 0, sizeof *m);
}

const struct ms_ptx_entry *ms_ptx_find(const struct ms_ptx_module *m, const char *name)
{
	for (int i = 0; i < m->nentries; i++)
		if (strcmp(m->entries[i].name, name) == 0)
			return &m->entries[i];
	return NULL;
}

/* ================================================================= images */

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

static int looks_like_ptx(const char *p, size_t max)
{
	/* PTX text: printable, with a .version directive near the start */
	size_t n = 0;
	while (n < max && p[n] && n < 65536)
		n++;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (c < 0x20 && c != '\n' && c != '\r' && c != '\t')
			return 0;
		if (c >= 0x80)
			return 0;
	}
	return memmem(p, n, ".version", 8) != NULL || (n == 65536 && memmem(p, n, ".entry", 6) != NULL);
}

int ms_image_kind(const void *image)
{
	if (!image)
		return MS_IMAGE_UNKNOWN;
	const unsigned char *b = image;
	/* byte by byte: a short NUL-terminated image is never read past its end */
	if ((b[0] == 0x50 && b[1] == 0xED && b[2] == 0x55 && b[3] == 0xBA) ||
	    (b[0] == 0xB1 && b[1] == 0x43 && b[2] == 0x62 && b[3] == 0x46))
		return MS_IMAGE_FATBIN;
	if (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F')
		return MS_IMAGE_CUBIN;
	if (looks_like_ptx(image, (size_t)-1))
		return MS_IMAGE_PTX;
	return MS_IMAGE_UNKNOWN;
}

int ms_fatbin_ptx(const void *image, int cc, const char **ptx, size_t *len, char *reason, size_t rlen)
{
	const unsigned char *b = image;
	uint32_t magic;
	memcpy(&magic, b, 4);
	if (magic == FATBIN_WRAPPER_MAGIC) {
		/* struct { int magic; int version; const unsigned long long *data; void *filename_or_fatbins; } */
		const void *data;
		memcpy(&data, b + 8, sizeof data);
		if (!data) {
			snprintf(reason, rlen, "fatbin wrapper without data");
			return -1;
		}
		b = data;
		memcpy(&magic, b, 4);
	}
	if (magic != FATBIN_MAGIC) {
		snprintf(reason, rlen, "not a fatbin");
		return -1;
	}
	uint16_t hsize;
	uint64_t fsize;
	memcpy(&hsize, b + 6, 2);
	memcpy(&fsize, b + 8, 8);
	if (hsize < 16 || fsize > (1ULL << 32)) {
		snprintf(reason, rlen, "malformed fatbin header");
		return -1;
	}
	const unsigned char *p = b + hsize, *end = b + hsize + fsize;
	int best_arch = -1, compressed = 0, ptx_entries = 0, too_new = 0;
	const char *best = NULL;
	size_t best_len = 0;
	while (p + 64 <= end) {
		uint16_t kind;
		uint32_t ehsize, arch;
		uint64_t padded, flags;
		uint32_t dsize;
		memcpy(&kind, p, 2);
		memcpy(&ehsize, p + 4, 4);
		memcpy(&padded, p + 8, 8);
		memcpy(&dsize, p + 16, 4);
		memcpy(&arch, p + 28, 4);
		memcpy(&flags, p + 40, 8);
		if (ehsize < 64 || p + ehsize + padded > end || ehsize > 4096)
			break;
		if (kind == 1) {
			ptx_entries++;
			const char *d = (const char *)(p + ehsize);
			size_t dl = dsize && dsize <= padded ? dsize : (size_t)padded;
			/* compression flags (0x1000/0x2000 LZ4, 0x8000 ZSTD) or a payload that is not text */
			if ((flags & 0xB000) || !looks_like_ptx(d, dl)) {
				compressed++;
			} else if (cc != 0 && (int)arch > cc) {
				too_new++;
			} else if ((int)arch > best_arch) {
				best_arch = (int)arch;
				best = d;
				best_len = strnlen(d, dl);
			}
		}
		p += ehsize + padded;
	}
	if (best) {
		*ptx = best;
		*len = best_len;
		return 0;
	}
	if (!ptx_entries)
		snprintf(reason, rlen, "the fatbin carries no PTX");
	else if (too_new)
		snprintf(reason, rlen, "the fatbin's plain PTX is for a newer architecture than %d%s", cc,
			 compressed ? " (and some is compressed)" : "");
	else
		snprintf(reason, rlen, "the fatbin's PTX is compressed (%d entr%s); not decompressed", compressed,
			 compressed == 1 ? "y" : "ies");
	return -1;
}

/* ================================================================= plans */

static unsigned umin(unsigned long long a, unsigned long long b)
{
	return (unsigned)(a < b ? a : b);
}

void ms_slice_plan_init(struct ms_slice_plan *p, const unsigned grid[3], unsigned max_blocks)
{
	memset(p, 0, sizeof *p);
	for (int i = 0; i < 3; i++)
		p->grid[i] = grid[i] ? grid[i] : 1;
	p->max_blocks = max_blocks ? max_blocks : 1;
	unsigned long long gx = p->grid[0], gy = p->grid[1], gz = p->grid[2], b = p->max_blocks;
	if (gx * gy * gz <= b)
		p->count = 1;
	else if (gx * gy <= b)
		p->count = (gz + b / (gx * gy) - 1) / (b / (gx * gy));
	else if (gx <= b)
		p->count = gz * ((gy + b / gx - 1) / (b / gx));
	else
		p->count = gz * gy * ((gx + b - 1) / b);
}

int ms_slice_plan_next(struct ms_slice_plan *p, struct ms_slice *s)
{
	if (p->next >= p->count)
		return 0;
	unsigned long long gx = p->grid[0], gy = p->grid[1], gz = p->grid[2], b = p->max_blocks, i = p->next++;
	memset(s, 0, sizeof *s);
	if (gx * gy * gz <= b) {
		s->dim[0] = (unsigned)gx, s->dim[1] = (unsigned)gy, s->dim[2] = (unsigned)gz;
	} else if (gx * gy <= b) {
		unsigned long long planes = b / (gx * gy);
		s->off[2] = (unsigned)(i * planes);
		s->dim[0] = (unsigned)gx, s->dim[1] = (unsigned)gy, s->dim[2] = umin(planes, gz - i * planes);
	} else if (gx <= b) {
		unsigned long long rows = b / gx, per = (gy + rows - 1) / rows;
		unsigned long long z = i / per, r = i % per;
		s->off[1] = (unsigned)(r * rows), s->off[2] = (unsigned)z;
		s->dim[0] = (unsigned)gx, s->dim[1] = umin(rows, gy - r * rows), s->dim[2] = 1;
	} else {
		unsigned long long per = (gx + b - 1) / b, row = i / per, c = i % per;
		s->off[0] = (unsigned)(c * b), s->off[1] = (unsigned)(row % gy), s->off[2] = (unsigned)(row / gy);
		s->dim[0] = umin(b, gx - c * b), s->dim[1] = 1, s->dim[2] = 1;
	}
	p->cur = *s;
	return 1;
}

/* ============================================================= the launch */

#ifndef MS_SLICE_PURE
#define CU_LAUNCH_PARAM_END ((void *)0)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

/* driver functions slicing uses beyond the ones hooks hand us */
static struct {
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*FuncGetAttribute)(int *, int, CUfunction);
	CUresult (*FuncSetAttribute)(CUfunction, int, int);
	CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int *, CUfunction, int, size_t);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*StreamIsCapturing)(CUstream, int *);
	CUresult (*KernelGetFunction)(CUfunction *, CUkernel);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LibraryGetKernel)(CUkernel *, CUlibrary, const char *);
} sd;

/* per-thread ring of events for the in-flight limit */
#define MS_RING 16
static __thread struct {
	CUcontext ctx;
	CUevent ev[MS_RING];
	int n;
} ring;

static int ring_ready(unsigned depth)
{
	CUcontext cur = NULL;
	if (!sd.EventCreate || !sd.EventRecord || !sd.EventSynchronize || !drv.cuCtxGetCurrent)
		return 0;
	drv.cuCtxGetCurrent(&cur);
	if (ring.ctx != cur) {
		for (int i = 0; i < ring.n; i++)
			if (sd.EventDestroy)
				sd.EventDestroy(ring.ev[i]);
		ring.n = 0;
		ring.ctx = cur;
	}
	while ((unsigned)ring.n < depth && ring.n < MS_RING) {
		if (sd.EventCreate(&ring.ev[ring.n], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
			return 0;
		ring.n++;
	}
	return ring.n >= (int)depth;
}
#endif

CUresult ms_slice_launch(ms_launch_fn launch, CUfunction twin, const struct ms_ptx_entry *e, unsigned gx,
			 unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream s,
			 void **params, void **extra, const struct ms_slice_policy *pol, unsigned long long *nslices)
{
	struct ms_slice_args args;
	unsigned grid[3] = { gx, gy, gz };
	args.grid[0] = gx, args.grid[1] = gy, args.grid[2] = gz;
	*nslices = 0;

	/* the parameters with ours appended */
	void *pbuf[64], **np = NULL, **xp = NULL, *xarr[5];
	unsigned char *buf = NULL;
	size_t bufsize = 0;
	if (extra) {
		void *ubuf = NULL;
		size_t usize = 0;
		for (int i = 0; extra[i] != NULL; i += 2) {
			if (extra[i] == (void *)1)
				ubuf = extra[i + 1];
			else if (extra[i] == (void *)2)
				usize = *(size_t *)extra[i + 1];
			else
				return CUDA_ERROR_NOT_SUPPORTED; /* something we do not know: do not guess */
		}
		if (!ubuf || usize < e->param_bytes)
			return CUDA_ERROR_INVALID_VALUE;
		bufsize = e->slice_offset + sizeof args;
		buf = calloc(1, bufsize);
		if (!buf)
			return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(buf, ubuf, e->param_bytes);
		xarr[0] = (void *)1, xarr[1] = buf, xarr[2] = (void *)2, xarr[3] = &bufsize, xarr[4] = NULL;
		xp = xarr;
	} else {
		size_t n = (size_t)e->nparams + 1;
		np = n <= 64 ? pbuf : malloc(n * sizeof *np);
		if (!np)
			return CUDA_ERROR_OUT_OF_MEMORY;
		if (e->nparams && !params) {
			if (np != pbuf)
				free(np);
			return CUDA_ERROR_INVALID_VALUE;
		}
		for (int i = 0; i < e->nparams; i++)
			np[i] = params[i];
		np[e->nparams] = &args;
	}

	struct ms_slice_plan plan;
	struct ms_slice sl;
	ms_slice_plan_init(&plan, grid, pol->max_blocks);
	unsigned depth = pol->max_inflight;
#ifndef MS_SLICE_PURE
	if (depth > MS_RING)
		depth = MS_RING;
	if (depth && !ring_ready(depth))
		depth = 0;
#else
	(void)depth;
#endif
	CUresult r = CUDA_SUCCESS;
	unsigned long long k = 0;
	while (ms_slice_plan_next(&plan, &sl)) {
		if (k > 0 && pol->between)
			pol->between(pol->arg, k, plan.count);
#ifndef MS_SLICE_PURE
		if (depth && k >= depth)
			sd.EventSynchronize(ring.ev[k % depth]);
#endif
		memcpy(args.off, sl.off, sizeof args.off);
		if (buf)
			memcpy(buf + e->slice_offset, &args, sizeof args);
		r = launch(twin, sl.dim[0], sl.dim[1], sl.dim[2], bx, by, bz, smem, s, np, xp);
		if (r != CUDA_SUCCESS)
			break;
#ifndef MS_SLICE_PURE
		if (depth)
			sd.EventRecord(ring.ev[k % depth], s);
#endif
		k++;
	}
	*nslices = k;
	if (np && np != pbuf)
		free(np);
	free(buf);
	return r;
}

/* ====================================================== the shim's hooks */

#ifndef MS_SLICE_PURE

int ms_slice_on;
static unsigned slice_blocks, slice_inflight = 2, slice_whole_waves = 1;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static struct migswap_slice_stats stats;
#define SSTAT(f, n) __atomic_add_fetch(&stats.f, (n), __ATOMIC_RELAXED)

/* A twin: the program's module and our rewritten copy of it. */
struct twin {
	void *app, *ours; /* CUmodule or CUlibrary; ours: NULL until loaded */
	int lib;          /* a library (cuLibraryLoadData) */
	/* The rewritten PTX is JIT-compiled at the first launch that is sliced
	 * (a module whose kernels never need slicing costs no second JIT). */
	pthread_mutex_t mu;
	int state; /* 0 rewritten, not loaded; 1 loaded; -1 not rewritten or the load failed */
	int nopts;
	int opts[64];
	void *vals[64];
	ms_libload_fn lib_load;
	struct ms_ptx_module info;
	char reason[256];
	struct twin *next;
};
static pthread_mutex_t twin_mu = PTHREAD_MUTEX_INITIALIZER;
static struct twin *twins;

/* CUfunction -> slice info: open addressing, read without a lock. */
struct fmap {
	_Atomic(CUfunction) key;
	CUfunction twin;                 /* the twin's function once looked up */
	const struct ms_ptx_entry *e;    /* in the twin's info; NULL: not sliceable */
	struct twin *tw;                 /* where the twin comes from */
	int kind;                        /* 0 module function, 1 library kernel, 2 a library kernel's function */
	void *app; /* its CUmodule or CUlibrary */
	int wave_orig, wave_twin;        /* blocks per wave (0 unknown) */
	unsigned wave_block, wave_smem;  /* launch shape they were computed for */
	int smem_mirrored;               /* max dynamic shared memory set on the twin */
	int failed;                      /* the twin failed to launch once */
	char reason[160];
};
#define FMAP_SIZE 16384
static struct fmap fmap[FMAP_SIZE];
static pthread_mutex_t fmap_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t fslot(CUfunction f)
{
	return (size_t)((((uintptr_t)f >> 4) * 0x9E3779B97F4A7C15ULL) >> 50) & (FMAP_SIZE - 1);
}

static struct fmap *fmap_find(CUfunction f)
{
	size_t i = fslot(f);
	for (size_t n = 0; n < FMAP_SIZE; n++, i = (i + 1) & (FMAP_SIZE - 1)) {
		CUfunction k = atomic_load_explicit(&fmap[i].key, memory_order_acquire);
		if (k == f)
			return &fmap[i];
		if (!k)
			return NULL;
	}
	return NULL;
}

/* fmap_put inserts or updates (under fmap_mu); the entry is published last. */
static void fmap_put(CUfunction f, struct twin *tw, int kind, const struct ms_ptx_entry *e, void *app,
		     const char *reason)
{
	pthread_mutex_lock(&fmap_mu);
	size_t i = fslot(f);
	struct fmap *slot = NULL;
	for (size_t n = 0; n < FMAP_SIZE; n++, i = (i + 1) & (FMAP_SIZE - 1)) {
		CUfunction k = atomic_load_explicit(&fmap[i].key, memory_order_relaxed);
		if (k == f || !k) {
			slot = &fmap[i];
			break;
		}
	}
	if (slot) {
		int fresh = atomic_load_explicit(&slot->key, memory_order_relaxed) == NULL;
		if (!fresh) /* a reused handle: stop slicing through it while we update */
			slot->e = NULL;
		slot->twin = NULL;
		slot->tw = tw;
		slot->kind = kind;
		slot->app = app;
		slot->wave_orig = slot->wave_twin = 0;
		slot->wave_block = slot->wave_smem = 0;
		slot->smem_mirrored = 0;
		slot->failed = 0;
		snprintf(slot->reason, sizeof slot->reason, "%s", reason ? reason : "");
		atomic_thread_fence(memory_order_release);
		slot->e = e;
		atomic_store_explicit(&slot->key, f, memory_order_release);
		if (e)
			SSTAT(functions_mapped, 1);
	}
	pthread_mutex_unlock(&fmap_mu);
}

static void *gpa(const char *name, int ver)
{
	void *p = NULL;
	if (drv.cuGetProcAddress_v2 && drv.cuGetProcAddress_v2(name, &p, ver, 0, NULL) == CUDA_SUCCESS)
		return p;
	p = NULL;
	if (drv.cuGetProcAddress && drv.cuGetProcAddress(name, &p, ver, 0) == CUDA_SUCCESS)
		return p;
	return NULL;
}

static void config(void)
{
	const char *e = getenv("MIGSWAP_SLICE_BLOCKS");
	if (e && *e)
		slice_blocks = (unsigned)strtoul(e, NULL, 0);
	e = getenv("MIGSWAP_SLICE_INFLIGHT");
	if (e && *e)
		slice_inflight = (unsigned)strtoul(e, NULL, 0);
	e = getenv("MIGSWAP_SLICE_WHOLE_WAVES"); /* 0: slices below a wave (tests) */
	if (e && *e)
		slice_whole_waves = (unsigned)strtoul(e, NULL, 0);
	if (!slice_blocks || !ms_ensure_drv())
		return;
	sd.EventCreate = gpa("cuEventCreate", 2000);
	sd.EventRecord = gpa("cuEventRecord", 2000);
	sd.EventSynchronize = gpa("cuEventSynchronize", 2000);
	sd.EventDestroy = gpa("cuEventDestroy", 4000);
	sd.FuncGetAttribute = gpa("cuFuncGetAttribute", 2020);
	sd.FuncSetAttribute = gpa("cuFuncSetAttribute", 9000);
	sd.DeviceGetAttribute = gpa("cuDeviceGetAttribute", 2000);
	sd.OccupancyMaxActiveBlocksPerMultiprocessor = gpa("cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050);
	sd.ModuleLoadData = gpa("cuModuleLoadData", 2000);
	sd.ModuleLoadDataEx = gpa("cuModuleLoadDataEx", 2010);
	sd.ModuleUnload = gpa("cuModuleUnload", 2000);
	sd.StreamIsCapturing = gpa("cuStreamIsCapturing", 10000);
	sd.KernelGetFunction = gpa("cuKernelGetFunction", 12000);
	sd.ModuleGetFunction = gpa("cuModuleGetFunction", 2000);
	sd.LibraryGetKernel = gpa("cuLibraryGetKernel", 12000);
	ms_slice_on = 1;
	ms_log("slicing on: at most %u blocks per slice%s, %u slices in flight", slice_blocks,
	       slice_whole_waves ? " (rounded to whole waves)" : "", slice_inflight);
}

void ms_slice_config(void)
{
	pthread_once(&config_once, config);
}

static int device_cc(void)
{
	CUdevice d;
	int maj = 0, min = 0;
	if (!drv.cuCtxGetDevice || !sd.DeviceGetAttribute || drv.cuCtxGetDevice(&d) != CUDA_SUCCESS)
		return 0;
	if (sd.DeviceGetAttribute(&maj, 75, d) != CUDA_SUCCESS || sd.DeviceGetAttribute(&min, 76, d) != CUDA_SUCCESS)
		return 0;
	return maj * 10 + min;
}


/* load_twin rewrites the image's PTX and keeps it (with the program's JIT
 * options) to be loaded as a second module (or library: lib_load set) when a
 * launch is first sliced. */
static void load_twin(void *app, const void *image, unsigned nopts, const int *opts, void *const *vals,
		      ms_libload_fn lib_load)
{
	struct twin *t = calloc(1, sizeof *t);
	if (!t)
		return;
	t->app = app;
	t->lib = lib_load != NULL;
	t->lib_load = lib_load;
	t->state = -1;
	pthread_mutex_init(&t->mu, NULL);
	for (unsigned i = 0; opts && vals && i < nopts && t->nopts < 64; i++) {
		/* 2 wall time, 3-6 info/error log buffers and sizes, 12 verbose log:
		 * those report back and stay the program's */
		if (opts[i] == 2 || (opts[i] >= 3 && opts[i] <= 6) || opts[i] == 12)
			continue;
		t->opts[t->nopts] = opts[i];
		t->vals[t->nopts] = vals[i];
		t->nopts++;
	}
	const char *ptx = NULL;
	size_t len = 0;
	int kind = ms_image_kind(image);
	if (kind == MS_IMAGE_PTX) {
		ptx = image;
		len = strlen(image);
	} else if (kind == MS_IMAGE_FATBIN) {
		if (ms_fatbin_ptx(image, device_cc(), &ptx, &len, t->reason, sizeof t->reason) != 0)
			ptx = NULL;
	} else {
		snprintf(t->reason, sizeof t->reason, "%s",
			 kind == MS_IMAGE_CUBIN ? "a cubin (machine code, no PTX)" : "not PTX, a fatbin or a cubin");
	}
	if (ptx) {
		ms_ptx_rewrite(ptx, len, &t->info);
		if (!t->info.ptx)
			snprintf(t->reason, sizeof t->reason, "%s", t->info.reason);
		else if (!(lib_load || sd.ModuleLoadData))
			snprintf(t->reason, sizeof t->reason, "cuModuleLoadData not found");
		else
			t->state = 0;
	}
	if (t->state == 0) {
		SSTAT(modules_rewritten, 1);
		SSTAT(entries_sliceable, (uint64_t)t->info.nsliceable);
		SSTAT(entries_refused, (uint64_t)(t->info.nentries - t->info.nsliceable));
		int idem = 0;
		for (int i = 0; i < t->info.nentries; i++)
			idem += t->info.entries[i].idempotent;
		ms_log("slicing: %s %p: %d of %d entries rewritten (%d provably idempotent)", t->lib ? "library" : "module",
		       app, t->info.nsliceable, t->info.nentries, idem);
		for (int i = 0; i < t->info.nentries; i++)
			if (!t->info.entries[i].sliceable)
				ms_log("slicing: %s left unsliced: %s", t->info.entries[i].name, t->info.entries[i].reason);
	} else {
		SSTAT(modules_skipped, 1);
		ms_log("slicing: %s %p not rewritten: %s", t->lib ? "library" : "module", app, t->reason);
		free(t->info.ptx);
		t->info.ptx = NULL;
	}
	pthread_mutex_lock(&twin_mu);
	t->next = twins;
	twins = t;
	pthread_mutex_unlock(&twin_mu);
}

/* twin_load JIT-compiles t's rewritten PTX once; returns the twin or NULL. */
static void *twin_load(struct twin *t)
{
	pthread_mutex_lock(&t->mu);
	if (t->state == 0) {
		double t0 = ms_now();
		CUresult r;
		if (t->lib_load)
			r = t->lib_load((CUlibrary *)&t->ours, t->info.ptx, t->nopts ? t->opts : NULL,
					t->nopts ? t->vals : NULL, (unsigned)t->nopts, NULL, NULL, 0);
		else if (t->nopts && sd.ModuleLoadDataEx)
			r = sd.ModuleLoadDataEx((CUmodule *)&t->ours, t->info.ptx, (unsigned)t->nopts, t->opts, t->vals);
		else
			r = sd.ModuleLoadData((CUmodule *)&t->ours, t->info.ptx);
		if (r == CUDA_SUCCESS) {
			t->state = 1;
			ms_log("slicing: %s %p: rewritten PTX (%zu bytes) loaded in %.3f s", t->lib ? "library" : "module",
			       t->app, t->info.ptx_len, ms_now() - t0);
		} else {
			t->ours = NULL;
			t->state = -1;
			snprintf(t->reason, sizeof t->reason, "loading the rewritten PTX failed: %s (%d)", ms_errstr(r), r);
			ms_log("slicing: %s %p: %s", t->lib ? "library" : "module", t->app, t->reason);
		}
		free(t->info.ptx);
		t->info.ptx = NULL;
	}
	void *ours = t->state == 1 ? t->ours : NULL;
	pthread_mutex_unlock(&t->mu);
	return ours;
}

CUresult ms_slice_module_load(ms_modload_fn real, CUmodule *m, const void *image)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(m, image);
	ms_slice_config();
	if (r == CUDA_SUCCESS && ms_slice_on && m && *m)
		load_twin(*m, image, 0, NULL, NULL, NULL);
	return r;
}

CUresult ms_slice_module_loadex(ms_modloadex_fn real, CUmodule *m, const void *image, unsigned n, int *opts,
				void **vals)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(m, image, n, opts, vals);
	ms_slice_config();
	if (r == CUDA_SUCCESS && ms_slice_on && m && *m)
		load_twin(*m, image, n, opts, vals, NULL);
	return r;
}

static struct twin *find_twin(void *app)
{
	pthread_mutex_lock(&twin_mu);
	struct twin *t = twins;
	while (t && t->app != app)
		t = t->next;
	pthread_mutex_unlock(&twin_mu);
	return t;
}

/* twin_entry returns name's rewritten entry in t, or NULL with the reason. */
static const struct ms_ptx_entry *twin_entry(struct twin *t, const char *name, char *why, size_t wl)
{
	const struct ms_ptx_entry *e = t->state >= 0 ? ms_ptx_find(&t->info, name) : NULL;
	why[0] = 0;
	if (t->state < 0)
		snprintf(why, wl, "%s not rewritten: %.130s", t->lib ? "library" : "module", t->reason);
	else if (!e)
		snprintf(why, wl, "no such entry in the PTX");
	else if (!e->sliceable)
		snprintf(why, wl, "not rewritten: %.140s", e->reason);
	return why[0] ? NULL : e;
}

CUresult ms_slice_module_getfn(ms_modgetfn_fn real, CUfunction *f, CUmodule m, const char *name)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (!sd.ModuleGetFunction)
		sd.ModuleGetFunction = real; /* the driver's, as the hook was handed it */
	CUresult r = real(f, m, name);
	if (r != CUDA_SUCCESS || !ms_slice_on || !f || !*f || !name)
		return r;
	struct twin *t = find_twin(m);
	if (!t)
		return r;
	char why[160];
	const struct ms_ptx_entry *e = twin_entry(t, name, why, sizeof why);
	fmap_put(*f, t, 0, e, m, why);
	return r;
}

/* forget_twin drops app's twin and the functions that use it; returns the
 * twin's handle (to unload) or NULL. */
static void *forget_twin(void *m)
{
	pthread_mutex_lock(&twin_mu);
	struct twin **pp = &twins, *t = NULL;
	for (; *pp; pp = &(*pp)->next)
		if ((*pp)->app == m) {
			t = *pp;
			*pp = t->next;
			break;
		}
	pthread_mutex_unlock(&twin_mu);
	if (!t)
		return NULL;
	/* forget its functions first: no launch may pick the twin up */
	pthread_mutex_lock(&fmap_mu);
	for (size_t i = 0; i < FMAP_SIZE; i++)
		if (atomic_load(&fmap[i].key) && fmap[i].app == m) {
			fmap[i].e = NULL;
			fmap[i].twin = NULL;
			fmap[i].tw = NULL;
			snprintf(fmap[i].reason, sizeof fmap[i].reason, "module unloaded");
		}
	pthread_mutex_unlock(&fmap_mu);
	/* t stays allocated: a launch may still hold it (entries point into
	 * t->info); it is small */
	pthread_mutex_lock(&t->mu);
	void *ours = t->state == 1 ? t->ours : NULL;
	t->state = -1;
	snprintf(t->reason, sizeof t->reason, "unloaded");
	pthread_mutex_unlock(&t->mu);
	t->next = NULL;
	return ours;
}

CUresult ms_slice_module_unload(ms_modunload_fn real, CUmodule m)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (ms_slice_on) {
		void *ours = forget_twin(m);
		if (ours)
			real((CUmodule)ours);
	}
	return real(m);
}

CUresult ms_slice_library_load(ms_libload_fn real, CUlibrary *l, const void *code, int *jo, void **jv, unsigned nj,
			       int *lo, void **lv, unsigned nl)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(l, code, jo, jv, nj, lo, lv, nl);
	ms_slice_config();
	if (r == CUDA_SUCCESS && ms_slice_on && l && *l)
		load_twin(*l, code, 0, NULL, NULL, real);
	return r;
}

CUresult ms_slice_library_getkernel(ms_libgetkernel_fn real, CUkernel *k, CUlibrary l, const char *name)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (!sd.LibraryGetKernel)
		sd.LibraryGetKernel = real;
	CUresult r = real(k, l, name);
	if (r != CUDA_SUCCESS || !ms_slice_on || !k || !*k || !name)
		return r;
	struct twin *t = find_twin(l);
	if (!t)
		return r;
	char why[160];
	const struct ms_ptx_entry *e = twin_entry(t, name, why, sizeof why);
	/* a CUkernel may be launched as a CUfunction */
	fmap_put((CUfunction)*k, t, 1, e, l, why);
	return r;
}

CUresult ms_slice_kernel_getfn(ms_kernelgetfn_fn real, CUfunction *f, CUkernel k)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (!sd.KernelGetFunction)
		sd.KernelGetFunction = real;
	CUresult r = real(f, k);
	if (r != CUDA_SUCCESS || !ms_slice_on || !f || !*f)
		return r;
	struct fmap *m = fmap_find((CUfunction)k);
	if (m && m->tw)
		fmap_put(*f, m->tw, 2, m->e, m->app, m->reason);
	return r;
}

CUresult ms_slice_library_unload(ms_libunload_fn real, CUlibrary l)
{
	if (!real)
		return CUDA_ERROR_NOT_FOUND;
	if (ms_slice_on) {
		void *ours = forget_twin(l);
		if (ours)
			real((CUlibrary)ours);
	}
	return real(l);
}

/* twin_function loads m's twin (the first time) and looks up its function;
 * NULL, and m never tried again, when that fails. */
static CUfunction twin_function(struct fmap *m)
{
	struct twin *tw = m->tw;
	const struct ms_ptx_entry *e = m->e;
	void *ours = tw && e ? twin_load(tw) : NULL;
	CUfunction tf = NULL;
	CUkernel tk = NULL;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	if (ours && m->kind == 0 && sd.ModuleGetFunction)
		r = sd.ModuleGetFunction(&tf, (CUmodule)ours, e->name);
	else if (ours && m->kind >= 1 && sd.LibraryGetKernel)
		r = sd.LibraryGetKernel(&tk, (CUlibrary)ours, e->name);
	if (r == CUDA_SUCCESS && m->kind == 1)
		tf = (CUfunction)tk;
	else if (r == CUDA_SUCCESS && m->kind == 2)
		r = sd.KernelGetFunction ? sd.KernelGetFunction(&tf, tk) : CUDA_ERROR_NOT_FOUND;
	if (r != CUDA_SUCCESS || !tf) {
		m->failed = 1;
		if (!ours && tw)
			snprintf(m->reason, sizeof m->reason, "%.150s", tw->reason);
		else
			snprintf(m->reason, sizeof m->reason, "no such function in the rewritten PTX: %s (%d)", ms_errstr(r), r);
		return NULL;
	}
	m->twin = tf;
	return tf;
}

/* blocks of f that fit on the device at once for this launch shape */
static int wave_of(CUfunction f, unsigned block, unsigned smem)
{
	int per_sm = 0, sms = 0;
	CUdevice d;
	if (!sd.OccupancyMaxActiveBlocksPerMultiprocessor || !sd.DeviceGetAttribute || !drv.cuCtxGetDevice)
		return 0;
	if (sd.OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, (int)block, smem) != CUDA_SUCCESS) {
		/* a CUkernel: ask about its function in this context */
		CUfunction kf = NULL;
		if (!sd.KernelGetFunction || sd.KernelGetFunction(&kf, (CUkernel)f) != CUDA_SUCCESS || !kf ||
		    sd.OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kf, (int)block, smem) != CUDA_SUCCESS)
			return 0;
	}
	if (drv.cuCtxGetDevice(&d) != CUDA_SUCCESS || sd.DeviceGetAttribute(&sms, 16, d) != CUDA_SUCCESS)
		return 0;
	return per_sm * sms;
}

int ms_slice_try_launch(ms_launch_fn real, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
			unsigned by, unsigned bz, unsigned smem, CUstream s, void **params, void **extra,
			void (*between)(void *, unsigned long long, unsigned long long), void *arg, CUresult *res)
{
	struct fmap *m = fmap_find(f);
	if (!m)
		return 0;
	const struct ms_ptx_entry *e = m->e;
	if (!e || m->failed || !real)
		return 0;
	unsigned long long blocks = (unsigned long long)gx * gy * gz;
	unsigned b = slice_blocks;
	unsigned block = bx * by * bz;
	if (blocks <= b)
		return 0;
	/* Never during a stream capture: the slices' event waits are not allowed
	 * then (and would invalidate a global-mode capture on another thread). */
	if (atomic_load_explicit(&ms_captures, memory_order_relaxed) > 0)
		return 0;
	int capturing = 0;
	if (sd.StreamIsCapturing && (sd.StreamIsCapturing(s, &capturing) != CUDA_SUCCESS || capturing != 0))
		return 0;
	CUfunction twin = m->twin;
	if (!twin && !(twin = twin_function(m)))
		return 0;
	/* more than 48 KiB of dynamic shared memory needs the attribute the
	 * program set on its function: set it on the twin too (before the
	 * occupancy query below, which depends on it) */
	if (smem > 48 * 1024 && (int)smem > m->smem_mirrored && sd.FuncGetAttribute && sd.FuncSetAttribute) {
		int v = 0;
		if (sd.FuncGetAttribute(&v, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, f) == CUDA_SUCCESS &&
		    sd.FuncSetAttribute(twin, 8, v) == CUDA_SUCCESS)
			m->smem_mirrored = v;
	}
	/* Slices are whole waves, and a grid that fits in one wave is never
	 * sliced: a kernel that (against CUDA's promise) relies on all its
	 * blocks being resident keeps running as it did. */
	if (slice_whole_waves && (m->wave_block != block || m->wave_smem != smem)) {
		m->wave_orig = wave_of(f, block, smem);
		m->wave_twin = wave_of(twin, block, smem);
		m->wave_block = block;
		m->wave_smem = smem;
	}
	if (slice_whole_waves && m->wave_orig && blocks <= (unsigned long long)m->wave_orig)
		return 0;
	if (slice_whole_waves && m->wave_twin > 0) {
		unsigned w = (unsigned)m->wave_twin;
		b = b < w ? w : b / w * w;
		if (blocks <= b)
			return 0;
	}
	struct ms_slice_policy pol = { b, slice_inflight, between, arg };
	unsigned long long n = 0;
	CUresult r = ms_slice_launch(real, twin, e, gx, gy, gz, bx, by, bz, smem, s, params, extra, &pol, &n);
	if (r != CUDA_SUCCESS && n == 0) {
		/* the twin cannot be launched like this: launch the program's own
		 * function, and do not try the twin again */
		m->failed = 1;
		snprintf(m->reason, sizeof m->reason, "the first slice failed: %s (%d)", ms_errstr(r), r);
		SSTAT(fallbacks, 1);
		ms_log("slicing: %s: first slice failed (%s); launching unsliced from now on", e->name, ms_errstr(r));
		return 0;
	}
	if (r != CUDA_SUCCESS)
		ms_log("slicing: %s: slice %llu failed (%s) after %llu launched", e->name, n + 1, ms_errstr(r), n);
	SSTAT(sliced_launches, 1);
	SSTAT(slices, n);
	*res = r;
	return 1;
}

void ms_slice_atfork_child(void)
{
	pthread_mutex_init(&twin_mu, NULL);
	pthread_mutex_init(&fmap_mu, NULL);
	ring.n = 0;
	ring.ctx = NULL;
}

__attribute__((visibility("default"))) int migswap_slice_get_stats(struct migswap_slice_stats *out)
{
	struct migswap_slice_stats s;
#define C(f) s.f = __atomic_load_n(&stats.f, __ATOMIC_RELAXED)
	C(modules_rewritten);
	C(modules_skipped);
	C(entries_sliceable);
	C(entries_refused);
	C(functions_mapped);
	C(sliced_launches);
	C(slices);
	C(fallbacks);
#undef C
	*out = s;
	return 0;
}

__attribute__((visibility("default"))) int migswap_slice_function_info(CUfunction f, char *reason, size_t len)
{
	if (!ms_slice_on)
		return -1;
	struct fmap *m = fmap_find(f);
	if (reason && len)
		snprintf(reason, len, "%s", m ? m->reason : "not looked up through cuModuleGetFunction");
	return m && m->e && !m->failed ? 1 : 0;
}
#endif
