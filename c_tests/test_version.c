/*
 * The versions agree: the library's tier_version(), the header's
 * KVTIER_VERSION_* macros, and the CMake project (package) version, which the
 * build passes as KVTIER_PACKAGE_VERSION. And the library this program runs
 * with was found by its soname, KVTIER_EXPECT_SONAME, the name the linker
 * recorded in DT_NEEDED.
 */
#include "test_util.h"

#ifndef KVTIER_PACKAGE_VERSION
#error "the build passes the CMake project version as KVTIER_PACKAGE_VERSION"
#endif
#ifndef KVTIER_EXPECT_SONAME
#error "the build passes the shared library's soname as KVTIER_EXPECT_SONAME"
#endif

int main(void) {
    char composed[64];
    Dl_info info;
    const char *file;
    const char *base;

    tu_start("test_version");
    printf("test_version: tier_version() %s, header %s, package %s\n", tier_version(), KVTIER_VERSION_STRING,
           KVTIER_PACKAGE_VERSION);
    CHECK(strcmp(tier_version(), KVTIER_VERSION_STRING) == 0);
    CHECK(strcmp(tier_version(), KVTIER_PACKAGE_VERSION) == 0);
    snprintf(composed, sizeof composed, "%d.%d.%d", KVTIER_VERSION_MAJOR, KVTIER_VERSION_MINOR,
             KVTIER_VERSION_PATCH);
    CHECK(strcmp(composed, KVTIER_VERSION_STRING) == 0);

    memset(&info, 0, sizeof info);
    /* The version string is static data of the library: dladdr names its file. */
    CHECK(dladdr((const void *)tier_version(), &info) != 0 && info.dli_fname != NULL);
    file = info.dli_fname;
    base = strrchr(file, '/') != NULL ? strrchr(file, '/') + 1 : file;
    printf("test_version: the library was loaded as %s\n", file);
    CHECK(strcmp(base, KVTIER_EXPECT_SONAME) == 0);
    /* The soname carries the ABI version. */
    snprintf(composed, sizeof composed, "libkvtier.so.%d", TIER_ABI_VERSION);
    CHECK(strcmp(KVTIER_EXPECT_SONAME, composed) == 0);
    printf("test_version: ok\n");
    return 0;
}
