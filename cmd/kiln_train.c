/* kiln_train.c - placeholder main until the module lands. */
#include "base/base.h"
#include <stdio.h>
int main(void)
{
    fprintf(stderr, "kiln_train: not built yet\n");
    return 1;
}
