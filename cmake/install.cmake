# install.cmake: what `cmake --install BUILD --prefix P` puts under P
# (GNUInstallDirs' folders; docs/ARCHITECTURE.md, "Installing"):
#
#   bin/kiln                     the CLI (libkiln linked in statically)
#   lib/libkiln.so.0.1.0         kiln_shared, with the libkiln.so.0.1 (SONAME)
#                                and libkiln.so links; exports KILN_API only
#   lib/libkiln.a                the same objects, static (runtime included)
#   lib/kiln/libkilnrt_gen.a     the runtime every generated library links;
#                                codegen/rtpath.c finds it relative to
#                                bin/kiln or libkiln.so, so P can move
#   include/kiln/kiln.h          the public header
#   lib/pkgconfig/kiln.pc        prefix taken from the file's own folder
#                                (${pcfiledir}), so it moves with P too
#   lib/cmake/kiln/              kilnConfig.cmake, kilnConfigVersion.cmake,
#                                kilnTargets*.cmake: find_package(kiln)
#                                gives kiln::kiln (shared), kiln::kiln_static
#
# and registers ctest `install` (tests/install/install.sh): installs this
# build into a temporary prefix, moves it, and compiles, links and runs
# against it with the installed CLI, pkg-config and find_package.
include(CMakePackageConfigHelpers)

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
set_target_properties(kiln_shared PROPERTIES EXPORT_NAME kiln)
set_target_properties(kiln PROPERTIES EXPORT_NAME kiln_static)

install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kiln_shared kiln EXPORT kilnTargets
	LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
	ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kilnrt_gen ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}/${KILN_RT_SUBDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
	FILES_MATCHING PATTERN "*.h")
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kilnConfig.cmake.in
	${CMAKE_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# 0.x: a minor version may change the API (as the SONAME says)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake
	VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kilnConfig.cmake ${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake
	DESTINATION ${KILN_CMAKE_DIR})

# kiln.pc: the prefix relative to the file; libkiln.a's libraries in
# Libs.private (LLVM has no .pc; protobuf-c's is left out of
# Requires.private so that building against libkiln.so needs none).
file(RELATIVE_PATH KILN_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" KILN_PC_TO_PREFIX "${KILN_PC_TO_PREFIX}")
file(RELATIVE_PATH KILN_PC_LIBDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
file(RELATIVE_PATH KILN_PC_INCLUDEDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
string(REPLACE ";" " " KILN_PC_PROTOBUF_C "${PROTOBUF_C_LDFLAGS}")
set(KILN_PC_LIBS_PRIVATE "-L${LLVM_LIB_DIR} ${LLVM_LIBS} ${KILN_PC_PROTOBUF_C} -lm -ldl -lpthread")
if(KILN_HAVE_CUDA) # the CUDA backend's NVRTC (CMakeLists.txt)
	get_filename_component(KILN_NVRTC_DIR ${CUDA_nvrtc_LIBRARY} DIRECTORY)
	string(APPEND KILN_PC_LIBS_PRIVATE " -L${KILN_NVRTC_DIR} -lnvrtc")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/kiln.pc.in ${CMAKE_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

add_test(NAME install COMMAND sh ${CMAKE_SOURCE_DIR}/tests/install/install.sh
	${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR} $<BOOL:${KILN_SANITIZE}>)
set_tests_properties(install PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
