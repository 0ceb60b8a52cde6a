// Umbrella header of the cpkit reference: a single-process, all-ranks CPU oracle in Eigen.
#pragma once

#include "cpkit/reference/attention.hpp"
#include "cpkit/reference/batch.hpp"
#include "cpkit/reference/cp_attention.hpp"
#include "cpkit/reference/error.hpp"
#include "cpkit/reference/gather.hpp"
#include "cpkit/reference/linear_loss.hpp"
#include "cpkit/reference/loss.hpp"
#include "cpkit/reference/offsets.hpp"
#include "cpkit/reference/packer.hpp"
#include "cpkit/reference/policy_loss.hpp"
#include "cpkit/reference/sharder.hpp"
#include "cpkit/reference/token_logprobs.hpp"
#include "cpkit/reference/types.hpp"
