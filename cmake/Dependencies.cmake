# All third-party discovery for moeserve lives here, and only here. Every package comes from
# Debian (see scripts/install-deps.sh); layers link the imported targets defined below.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)                      # libfmt-dev
find_package(nlohmann_json 3.10 REQUIRED)       # nlohmann-json3-dev
find_package(hwy REQUIRED)                      # libhwy-dev: hwy::hwy, hwy::hwy_test
find_package(GTest REQUIRED)                    # libgtest-dev
find_package(benchmark REQUIRED)                # libbenchmark-dev
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)   # libpcre2-dev (tokenizer)
find_package(MPI COMPONENTS CXX)                # libopenmpi-dev (parallel, optional for now)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)  # libutf8proc-dev (NFC)
# make-model's real-shape presets: the embedded Qwen3 tokenizer.json is gzip-compressed (cli/).
find_package(ZLIB REQUIRED)                     # zlib1g-dev
# The server's HTTP front: Boost.Beast over Boost.Asio, header-only (libboost-dev;
# docs/reliability.md says why). Asio without the deprecated io_service names.
find_package(Boost 1.74 REQUIRED)
set_property(TARGET Boost::headers APPEND PROPERTY
             INTERFACE_COMPILE_DEFINITIONS BOOST_ASIO_NO_DEPRECATED)
# HTTP clients: bench serve and the tests (libcpp-httplib-dev).
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# httplib's listen backlog is 5: a burst of clients connecting at once (bench serve, 32 streams)
# overflows it and their connections fail. Every user of the header must agree on the value.
set_property(TARGET PkgConfig::HTTPLIB APPEND PROPERTY
             INTERFACE_COMPILE_DEFINITIONS CPPHTTPLIB_LISTEN_BACKLOG=1024)
