// Umbrella header of the cpkit optimized path: the LibTorch API trainers link.
#pragma once

#include "cpkit/optimized/attention_plan.hpp"
#include "cpkit/optimized/batch.hpp"
#include "cpkit/optimized/communicator.hpp"
#include "cpkit/optimized/constants.hpp"
#include "cpkit/optimized/error.hpp"
#include "cpkit/optimized/gather.hpp"
#include "cpkit/optimized/host_cache.hpp"
#include "cpkit/optimized/launch.hpp"
#include "cpkit/optimized/linear_loss.hpp"
#include "cpkit/optimized/logits_precision.hpp"
#include "cpkit/optimized/loss.hpp"
#include "cpkit/optimized/offsets.hpp"
#include "cpkit/optimized/process_group.hpp"
#include "cpkit/optimized/sharder.hpp"
#include "cpkit/optimized/token_logprobs.hpp"
#include "cpkit/optimized/validation.hpp"
