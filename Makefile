# `make` builds the plugin as NCCL names it (libnccl-net-rivet.so) and the rivet CLI;
# `make install PREFIX=...` installs both; `make test` runs every test; `make dist` builds the
# release tarballs for x86_64 and aarch64 (glibc 2.17, stripped, see ci/dist.sh), their SHA256SUMS,
# and checks them; ci/dist-deps.sh first installs what that needs (zig in a virtual environment).
PREFIX ?= /usr/local
REL := target/release

all:
	cargo build --release
	cp -f $(REL)/libnccl_net_rivet.so $(REL)/libnccl-net-rivet.so

install: all
	install -D -m 755 $(REL)/libnccl-net-rivet.so $(DESTDIR)$(PREFIX)/lib/libnccl-net-rivet.so
	install -D -m 755 $(REL)/rivet $(DESTDIR)$(PREFIX)/bin/rivet

test:
	bash ci/test.sh

bench:
	python3 ci/bench_tcp.py

dist:
	bash ci/dist-deps.sh
	bash ci/dist.sh --check

.PHONY: all install test bench dist
