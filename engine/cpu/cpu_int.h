/* cpu_int.h - what the CPU backend's files share (engine/cpu/): the column-sum kernel of the
 * bias gradients and the bf16 group's sticky status. Nothing outside engine/cpu/ includes it. */
#ifndef KILN_ENGINE_CPU_INT_H
#define KILN_ENGINE_CPU_INT_H

#include "engine/backend.h"

/* dbias (OC) += column sums of dout (N,OC); threads own column ranges, rows added in order. */
void eng_cpu_colsum_acc(float *dbias, const float *dout, int N, int OC);
/* The CPU's AdamW that also writes the updated weights rounded to bf16 (the bf16 group's). */
void eng_cpu_adamw_bf16(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps, float wd,
                        float grad_scale, int64_t t);
/* 0, or KILN_EDEVICE with err describing the first oneDNN failure of the bf16 group. */
int eng_cpu_bf16_status(kiln_err_t *err);

#endif /* KILN_ENGINE_CPU_INT_H */
