# Copies of probe_prog_O2 with their DWARF moved or gone, for the ELF and debuginfo tests:
#   stripped/     strip --strip-all: .dynsym only, no DWARF
#   nodebug/      strip --strip-debug: .symtab, no DWARF, no debuglink
#   split/        the binary without DWARF but with a .gnu_debuglink to .debug/NAME.debug
#   buildid-root/ a debug root holding .build-id/XX/REST.debug for the binary's build-id
# and what binutils say about the originals (nm, readelf -n), which the tests check against.
if(NOT CMAKE_OBJCOPY OR NOT CMAKE_STRIP OR NOT CMAKE_NM OR NOT CMAKE_READELF)
  message(FATAL_ERROR "the debuginfo tests need objcopy, strip, nm and readelf")
endif()

set(variants ${CMAKE_CURRENT_BINARY_DIR}/debuginfo_variants)
set(prog $<TARGET_FILE:probe_prog_O2>)
set(prog_name probe_prog_O2)

add_custom_command(
  OUTPUT ${variants}/stripped/${prog_name} ${variants}/nodebug/${prog_name}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${variants}/stripped ${variants}/nodebug
  COMMAND ${CMAKE_STRIP} --strip-all -o ${variants}/stripped/${prog_name} ${prog}
  COMMAND ${CMAKE_STRIP} --strip-debug -o ${variants}/nodebug/${prog_name} ${prog}
  DEPENDS probe_prog_O2
  VERBATIM)

add_custom_command(
  OUTPUT ${variants}/split/${prog_name} ${variants}/split/.debug/${prog_name}.debug
  COMMAND ${CMAKE_COMMAND} -E make_directory ${variants}/split/.debug
  COMMAND ${CMAKE_OBJCOPY} --only-keep-debug ${prog} ${variants}/split/.debug/${prog_name}.debug
  COMMAND ${CMAKE_OBJCOPY} --strip-debug
          --add-gnu-debuglink=${variants}/split/.debug/${prog_name}.debug
          ${prog} ${variants}/split/${prog_name}
  DEPENDS probe_prog_O2
  VERBATIM)

# The build-id's path is known only once the program is linked: a shell reads it.
set(by_id_dir [=[d="$2/.build-id/$(cut -c1-2 "$1")"]=])
set(by_id_copy [=[cp "$3" "$d/$(cut -c3- "$1").debug"]=])
add_custom_command(
  OUTPUT ${variants}/${prog_name}.build-id ${variants}/buildid-root.stamp
  COMMAND sh -c "${CMAKE_READELF} -n \"$1\" | sed -n 's/^ *Build ID: *//p' > \"$2\""
          sh ${prog} ${variants}/${prog_name}.build-id
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${variants}/buildid-root
  COMMAND sh -c "test -s \"$1\" && ${by_id_dir} && mkdir -p \"$d\" && ${by_id_copy}"
          sh ${variants}/${prog_name}.build-id ${variants}/buildid-root
          ${variants}/split/.debug/${prog_name}.debug
  COMMAND ${CMAKE_COMMAND} -E touch ${variants}/buildid-root.stamp
  DEPENDS probe_prog_O2 ${variants}/split/.debug/${prog_name}.debug
  VERBATIM)

set(nm_lists)
foreach(tgt probe_prog_O0 probe_prog_O2 probefs_probe_lib)
  add_custom_command(
    OUTPUT ${variants}/${tgt}.nm
    COMMAND sh -c "${CMAKE_NM} --defined-only \"$1\" > \"$2\"" sh $<TARGET_FILE:${tgt}>
            ${variants}/${tgt}.nm
    DEPENDS ${tgt}
    VERBATIM)
  list(APPEND nm_lists ${variants}/${tgt}.nm)
endforeach()

add_custom_command(
  OUTPUT ${variants}/not_elf
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_CURRENT_SOURCE_DIR}/probe_prog.c ${variants}/not_elf
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/probe_prog.c
  VERBATIM)

add_custom_target(probe_prog_debuginfo_variants DEPENDS
  ${variants}/stripped/${prog_name} ${variants}/nodebug/${prog_name}
  ${variants}/split/${prog_name} ${variants}/split/.debug/${prog_name}.debug
  ${variants}/buildid-root.stamp ${nm_lists} ${variants}/not_elf)

add_dependencies(tools_elf_debuginfo_test probe_prog_debuginfo_variants)
add_dependencies(tools_probe_command_test probe_prog_debuginfo_variants)
target_compile_definitions(tools_elf_debuginfo_test PRIVATE
  PROBE_PROG_STRIPPED="${variants}/stripped/${prog_name}"
  PROBE_PROG_NODEBUG="${variants}/nodebug/${prog_name}"
  PROBE_PROG_SPLIT="${variants}/split/${prog_name}"
  PROBE_PROG_SPLIT_DEBUG="${variants}/split/.debug/${prog_name}.debug"
  PROBE_PROG_BUILD_ID_FILE="${variants}/${prog_name}.build-id"
  PROBE_BUILD_ID_ROOT="${variants}/buildid-root"
  PROBE_PROG_O0_NM="${variants}/probe_prog_O0.nm"
  PROBE_PROG_O2_NM="${variants}/probe_prog_O2.nm"
  PROBE_LIB_NM="${variants}/probefs_probe_lib.nm"
  PROBE_NOT_ELF="${variants}/not_elf")
