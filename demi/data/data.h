// The data module in one include: datasets, sources, readers, transforms, iterators and prefetching.
#pragma once

#include "demi/data/cifar10.h"
#include "demi/data/dataset.h"
#include "demi/data/iterator.h"
#include "demi/data/mnist.h"
#include "demi/data/prefetch.h"
#include "demi/data/sources.h"
#include "demi/data/synthetic.h"
#include "demi/data/transforms.h"
