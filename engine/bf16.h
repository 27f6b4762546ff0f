/* bf16.h - bfloat16 as kiln stores it: the upper 16 bits of an IEEE fp32, rounded to nearest
 * even; NaNs stay (quiet) NaNs. One definition for the CPU backend, the reference backend and the
 * collectives' bf16 wire format. Header only. */
#ifndef KILN_ENGINE_BF16_H
#define KILN_ENGINE_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t eng_bf16_round(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float eng_bf16_value(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

#endif /* KILN_ENGINE_BF16_H */
