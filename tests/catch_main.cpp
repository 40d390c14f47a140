// Catch2's main, compiled once into an object library shared by every test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
