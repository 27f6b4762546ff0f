/* model.c - the engine's models: one implementation (eng_<name>_model, a table of functions in
 * the model's own file) for each row of spec.h's capability table, found by model.type. A row
 * without its implementation does not link. It holds no model itself (gpt.c, mlp.c). */
#include "engine/engine.h"
#include "spec/spec.h"

#include <string.h>

#define X(name, fields, caps, example, blocks) extern const eng_model_ops_t eng_##name##_model;
SPEC_MODEL_MAP(X)
#undef X

static const eng_model_ops_t *const models[] = {
#define X(name, fields, caps, example, blocks) &eng_##name##_model,
    SPEC_MODEL_MAP(X)
#undef X
};

const eng_model_ops_t *eng_model_find(const char *name)
{
    for (size_t i = 0; name && i < KILN_ARRAY_LEN(models); i++)
        if (!strcmp(models[i]->name, name))
            return models[i];
    return NULL;
}
