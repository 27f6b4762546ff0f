/* cpu_int.h - what the CPU backend's files share (engine/cpu/): the column-sum kernel of the
 * bias gradients, oneDNN's GEMMs (onednn.c) and their sticky status. Nothing outside engine/cpu/ includes it. */
#ifndef KILN_ENGINE_CPU_INT_H
#define KILN_ENGINE_CPU_INT_H

#include "engine/backend.h"

/* dbias (OC) += column sums of dout (N,OC); threads own column ranges, rows added in order. */
void eng_cpu_colsum_acc(float *dbias, const float *dout, int N, int OC);
/* The CPU's AdamW that also writes the updated weights rounded to bf16 (the bf16 group's). */
void eng_cpu_adamw_bf16(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps, float wd,
                        float grad_scale, int64_t t);
/* 0, or KILN_EDEVICE with err describing the first oneDNN failure (bf16 group or fp32 GEMMs). */
int eng_cpu_onednn_status(kiln_err_t *err);
/* Whether the backend's fp32 GEMMs go through oneDNN (onednn.c: its AVX-512 kernels, or
 * eng_cpu_settings_set's sgemm), decided once; *impl (may be NULL) names what runs them. */
bool eng_cpu_onednn_sgemm(const char **impl);
/* fp32 matmul_forward and the two GEMMs of matmul_backward (dinp overwritten, dw accumulated;
 * either may be NULL) through oneDNN. */
void eng_cpu_onednn_sgemm_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                                  int OC);
void eng_cpu_onednn_sgemm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                   int N, int C, int OC);

#endif /* KILN_ENGINE_CPU_INT_H */
