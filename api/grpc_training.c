/* grpc_training.c - TrainingService over gRPC: converts the service's JSON jobs, events, metric
 * series and workers into proto messages. (Not implemented yet: the table is empty, so these
 * methods answer UNIMPLEMENTED through the generic handler.) */
#include "api/grpc_int.h"

const api_grpc_method_t api_grpc_training_methods[1] = {{NULL, NULL, NULL}};
const size_t api_grpc_training_method_count = 0;
