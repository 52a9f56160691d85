/* A QEMU user-mode plugin: instructions executed, per translation block (QEMU 7.2's plugin
 * API, version 1; the few declarations it needs are written out here, so no QEMU headers are
 * needed). At exit it writes "vaddr insns executions" per block and "total N" to $ICOUNT_OUT.
 * Built and used by scripts/neon-icount.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*tb_trans_cb)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*udata_cb)(qemu_plugin_id_t, void *);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, tb_trans_cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, udata_cb, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);
__attribute__((visibility("default"))) int qemu_plugin_version = 1;
struct rec { uint64_t vaddr, n, count; struct rec *next; };
static struct rec *head;
static void trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  struct rec *r = calloc(1, sizeof *r);
  r->vaddr = qemu_plugin_tb_vaddr(tb); r->n = qemu_plugin_tb_n_insns(tb);
  r->next = head; head = r;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &r->count, 1);
}
static void done(qemu_plugin_id_t id, void *u) {
  const char *path = getenv("ICOUNT_OUT");
  FILE *f = fopen(path ? path : "icount.txt", "w");
  uint64_t total = 0;
  for (struct rec *r = head; r; r = r->next) if (r->count) { fprintf(f, "%lx %lu %lu\n", r->vaddr, r->n, r->count); total += r->n * r->count; }
  fprintf(f, "total %lu\n", total); fclose(f);
}
__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
  qemu_plugin_register_vcpu_tb_trans_cb(id, trans);
  qemu_plugin_register_atexit_cb(id, done, NULL);
  return 0;
}
