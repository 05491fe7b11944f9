// Being written (issue 7).
#include <gtest/gtest.h>
