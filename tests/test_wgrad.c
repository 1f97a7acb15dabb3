#include "tests.h"
void test_wgrad_bias_partials(void) {}
void test_wgrad_bound(void) {}
void test_wgrad_linear(void) {}
void test_wgrad_bad_input(void) {}
void test_wgrad_grid_kernels(void) {}
