# mk/dev.mk — the kernel developers' checks (dev/), included by the root
# Makefile.
#
#   make CUDA=0 dev-check   the emitted code of every hot kernel loop has its
#                           prefetches (dev/check_prefetch.sh), and every
#                           kernel of every ISA this CPU runs equals the
#                           reference bit for bit, also through the public
#                           entry under hostile caller MXCSRs with the
#                           caller's word given back unchanged
#                           (build/dev/sumsq_kernels quick, ~10-20 s)
#
# The full checker (a minute or so): build/dev/sumsq_kernels check [SEED].

.PHONY: dev-check
dev-check: lib $(BUILD)/dev/sumsq_kernels
	bash dev/check_prefetch.sh $(BUILD)
	$(BUILD)/dev/sumsq_kernels quick
