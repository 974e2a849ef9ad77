// The one catalogue of user-facing errors of the dynamic-events language: every message a
// user can see in error_log or in a filter file, with the errno the failing write returns.
// Messages and errno values are facts taken from the kernel's observable behaviour (see the
// reference captures); positions are byte offsets into the command as error_log prints it.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

namespace probefs::events {

// X(code, message, errno). kSilent is a rejection that writes nothing to error_log: the
// kernel rejects some inputs (unknown probe type, a place without ':', ...) with EINVAL
// and no message.
#define PROBEFS_EVENTS_ERRORS(X)                                                          \
  X(kSilent, "", EINVAL)                                                                  \
  X(kFileNotFound, "Failed to find the given file", ENOENT)                               \
  X(kNoRegularFile, "Not a regular file", EINVAL)                                         \
  /* probefs's own: a target runs a file no longer on disk as it mapped it; a USDT   */ \
  /* point's argument is an operand no fetch can read (a %rip-relative symbol)        */ \
  X(kMappedFileGone, "The file the target mapped was replaced or deleted", ESTALE)        \
  X(kSdtArgUnreadable, "This SDT argument cannot be fetched", EINVAL)                    \
  X(kBadRefcnt, "Invalid reference counter offset", EINVAL)                              \
  X(kRefcntOpenBrace, "Reference counter brace is not closed", EINVAL)                   \
  X(kBadRefcntSuffix, "Reference counter has wrong suffix", EINVAL)                      \
  X(kBadUprobeOffs, "Invalid uprobe offset", EINVAL)                                     \
  X(kBadMaxactType, "Maxactive is only for function exit", EINVAL)                       \
  X(kBadMaxact, "Invalid maxactive number", EINVAL)                                      \
  X(kMaxactTooBig, "Maxactive is too big", EINVAL)                                       \
  X(kBadProbeAddr, "Invalid probed address or symbol", EINVAL)                           \
  X(kNonUniqSymbol, "The symbol is not unique", EINVAL)                                  \
  X(kBadRetprobe, "Retprobe address must be an function entry", EINVAL)                  \
  X(kNoTracepoint, "Tracepoint is not found", EINVAL)                                    \
  X(kBadTpName, "Invalid character in tracepoint name", EINVAL)                          \
  X(kBadAddrSuffix, "Invalid probed address suffix", EINVAL)                             \
  X(kNoGroupName, "Group name is not specified", EINVAL)                                 \
  X(kGroupTooLong, "Group name is too long", EINVAL)                                     \
  X(kBadGroupName, "Group name must follow the same rules as C identifiers", EINVAL)     \
  X(kNoEventName, "Event name is not specified", EINVAL)                                 \
  X(kEventTooLong, "Event name is too long", EINVAL)                                     \
  X(kBadEventName, "Event name must follow the same rules as C identifiers", EINVAL)     \
  X(kEventExist, "Given group/event name is already used by another event", EEXIST)      \
  X(kRetvalOnProbe, "$retval is not available on probe", EINVAL)                         \
  X(kBadStackNum, "Invalid stack number", EINVAL)                                        \
  X(kBadArgNum, "Invalid argument number", EINVAL)                                       \
  X(kBadVar, "Invalid $-variable specified", EINVAL)                                     \
  X(kBadRegName, "Invalid register name", EINVAL)                                        \
  X(kBadMemAddr, "Invalid memory address", EINVAL)                                       \
  X(kBadImm, "Invalid immediate value", EINVAL)                                          \
  X(kImmstrNoClose, "String is not closed with '\"'", EINVAL)                            \
  X(kFileOnKprobe, "File offset is not available with kprobe", EINVAL)                   \
  X(kBadFileOffs, "Invalid file offset value", EINVAL)                                   \
  X(kSymOnUprobe, "Symbol is not available with uprobe", EINVAL)                         \
  X(kTooManyOps, "Dereference is too much nested", EINVAL)                               \
  X(kDerefNeedBrace, "Dereference needs a brace", EINVAL)                                \
  X(kBadDerefOffs, "Invalid dereference offset", EINVAL)                                 \
  X(kDerefOpenBrace, "Dereference brace is not closed", EINVAL)                          \
  X(kCommCantDeref, "$comm can not be dereferenced", EINVAL)                             \
  X(kBadFetchArg, "Invalid fetch argument", EINVAL)                                      \
  X(kArrayNoClose, "Array is not closed", EINVAL)                                        \
  X(kBadArraySuffix, "Array has wrong suffix", EINVAL)                                   \
  X(kBadArrayNum, "Invalid array size", EINVAL)                                          \
  X(kArrayTooBig, "Array number is too big", EINVAL)                                     \
  X(kBadType, "Unknown type is specified", EINVAL)                                       \
  X(kBadString, "String accepts only memory argument", EINVAL)                           \
  X(kBadSymstring, "Symbol String doesn't accept data/userdata", EINVAL)                 \
  X(kBadBitfield, "Invalid bitfield", EINVAL)                                            \
  X(kArgNameTooLong, "Argument name is too long", EINVAL)                                \
  X(kNoArgName, "Argument name is not specified", EINVAL)                                \
  X(kBadArgName, "Argument name must follow the same rules as C identifiers", EINVAL)    \
  X(kUsedArgName, "This argument name is already used", EINVAL)                          \
  X(kArgTooLong, "Argument expression is too long", E2BIG)                               \
  X(kNoArgBody, "No argument expression", EINVAL)                                        \
  X(kBadInsnBndry, "Probe point is not an instruction boundary", EILSEQ)                 \
  X(kFailRegProbe, "Failed to register probe event", EINVAL)                             \
  X(kDiffProbeType, "Probe type is different from existing probe", EEXIST)               \
  X(kDiffArgType, "Argument type or name is different from existing probe", EEXIST)      \
  X(kSameProbe, "There is already the exact same probe event", EEXIST)                   \
  X(kNosupBtfarg, "BTF is not available or not supported", EINVAL)                       \
  X(kNofentryArgs, "$arg* can be used only on function entry or exit", EINVAL)           \
  X(kNeedStringType, "$comm and immediate-string only accepts string type", EINVAL)      \
  X(kTooManyArgs, "Too many arguments are specified", E2BIG)                             \
  /* probefs's own: a process that could not become a target */                         \
  X(kTargetLimit, "Too many traced processes", ENOSPC)                                   \
  X(kUntraceable, "A process runs untraced: probefs cannot enter it", EPERM)             \
  /* filter language */                                                                  \
  X(kFiltInvalidOp, "Invalid operator", EINVAL)                                          \
  X(kFiltTooManyOpen, "Too many '('", ENOENT)                                            \
  X(kFiltTooManyClose, "Too few '('", EPERM)                                             \
  X(kFiltMissingQuote, "Missing matching quote", EINVAL)                                 \
  X(kFiltOperandTooLong, "Operand too long", EINVAL)                                     \
  X(kFiltExpectString, "Expecting string field", EINVAL)                                 \
  X(kFiltExpectDigit, "Expecting numeric field", EINVAL)                                 \
  X(kFiltIllegalFieldOp, "Illegal operation for field type", EINVAL)                     \
  X(kFiltFieldNotFound, "Field not found", EINVAL)                                       \
  X(kFiltIllegalIntval, "Illegal integer value", EINVAL)                                 \
  X(kFiltBadSubsysFilter, "Couldn't find or set field in one of a subsystem's events",   \
    EINVAL)                                                                              \
  X(kFiltTooManyPreds, "Too many terms in predicate expression", EINVAL)                 \
  X(kFiltInvalidValue, "Invalid value (did you forget quotes)?", EINVAL)                 \
  X(kFiltErrno, "Error", EINVAL)                                                         \
  /* hist triggers (trace_events_hist.c) */                                              \
  X(kHistNamedMismatch,                                                                  \
    "Named hist trigger doesn't match existing named trigger (includes variables)", EINVAL) \
  X(kHistTriggerExists, "Hist trigger already exists", EEXIST)                           \
  X(kHistTriggerEnoentClear, "Can't clear or continue a nonexistent hist trigger", ENOENT) \
  X(kHistBadFieldModifier, "Invalid field modifier", EINVAL)                             \
  X(kHistCreateFail, "Couldn't create histogram for field", EINVAL)                      \
  X(kHistFieldNotFound, "Couldn't find field", EINVAL)                                   \
  X(kHistEmptyAssignment, "Empty assignment", EINVAL)                                    \
  X(kHistInvalidSortModifier, "Invalid sort modifier", EINVAL)                           \
  X(kHistEmptySortField, "Empty sort field", EINVAL)                                     \
  X(kHistTooManySortFields, "Too many sort fields (Max = 2)", EINVAL)                    \
  X(kHistInvalidSortField, "Sort field must be a key or a val", EINVAL)                 \
  X(kHistDuplicateVar, "Variable already defined", EINVAL)                               \
  X(kHistVarNotUnique,                                                                   \
    "Variable name not unique, need to use fully qualified name (subsys.event.var) for " \
    "variable", EINVAL)                                                                  \
  X(kHistTooManyVars, "Too many variables defined", EINVAL)                              \
  X(kHistTooManySubexpr, "Too many subexpressions (3 max)", EINVAL)                      \
  X(kHistTimestampMismatch, "Timestamp units in expression don't match", EINVAL)         \
  X(kHistHistNotFound, "Matching event histogram not found", EINVAL)                     \
  X(kHistSynthEventNotFound, "Couldn't find synthetic event", EINVAL)                    \
  X(kHistSynthTypeMismatch, "Param type doesn't match synthetic event field type", EINVAL) \
  X(kHistSynthCountMismatch, "Param count doesn't match synthetic event field count", EINVAL) \
  X(kHistTooManyParams, "Too many action params", EINVAL)                                \
  X(kHistParamNotFound, "Couldn't find param", EINVAL)                                   \
  X(kHistActionNotFound, "No action found", EINVAL)                                      \
  X(kHistNoClosingParen, "No closing paren found", EINVAL)                               \
  X(kHistSubsysNotFound, "Missing subsystem", EINVAL)                                    \
  X(kHistInvalidSubsysEvent, "Invalid subsystem or event name", EINVAL)                  \
  X(kHistInvalidRefKey, "Using variable references in keys not supported", EINVAL)       \
  X(kHistVarNotFound, "Couldn't find variable", EINVAL)                                  \
  X(kHistInvalidStrOperand, "String type can not be an operand in expression", EINVAL)   \
  X(kHistOnxNotVar, "For onmax(x) or onchange(x), x must be a variable", EINVAL)         \
  X(kHistOnxVarNotFound, "Couldn't find onmax or onchange variable", EINVAL)             \
  X(kHistFieldVarCreateFail, "Couldn't create field variable", EINVAL)                   \
  X(kHistTooManySaveActions, "Can't have more than one save() action per hist", EEXIST)  \
  X(kHistActionMismatch, "Handler doesn't support action", EINVAL)                       \
  X(kHistInvalidParam, "Invalid action param", EINVAL)                                   \
  X(kHistUnaryMinusSubexpr, "Unary minus not supported in sub-expressions", EINVAL)      \
  X(kHistDivisionByZero, "Division by zero", EDOM)                                       \
  /* synthetic events (trace_events_synth.c) */                                          \
  X(kSynthBadName, "Illegal name", EINVAL)                                               \
  X(kSynthInvalidCmd, "Command must be of the form: <name> field[;field] ...", EINVAL)   \
  X(kSynthInvalidDynCmd,                                                                 \
    "Command must be of the form: s or -:[synthetic/]<name> field[;field] ...", EINVAL)  \
  X(kSynthEventExists, "Event already exists", EEXIST)                                   \
  X(kSynthTooManyFields, "Too many fields", EINVAL)                                      \
  X(kSynthIncompleteType, "Incomplete type", EINVAL)                                     \
  X(kSynthInvalidType, "Invalid type", EINVAL)                                           \
  X(kSynthInvalidField, "Invalid field", EINVAL)                                         \
  X(kSynthInvalidArraySpec, "Invalid array specification", EINVAL)

enum class ErrorCode : uint8_t {
#define PROBEFS_EVENTS_ERROR_ENUM(code, msg, err) code,
  PROBEFS_EVENTS_ERRORS(PROBEFS_EVENTS_ERROR_ENUM)
#undef PROBEFS_EVENTS_ERROR_ENUM
};

// The catalogue's message ("" for kSilent) and default errno (positive) for a code.
std::string_view error_message(ErrorCode code);
int error_errno(ErrorCode code);

// Where an error_log entry says it comes from.
inline constexpr std::string_view kLogUprobe = "trace_uprobe";
inline constexpr std::string_view kLogKprobe = "trace_kprobe";
inline constexpr std::string_view kLogFprobe = "trace_fprobe";
inline constexpr std::string_view kLogFilter = "event filter parse error";
// Entries about the traced processes themselves (no kernel counterpart).
inline constexpr std::string_view kLogProbefs = "probefs";

// A positioned error: what went wrong, the errno the write returns, and where error_log's
// caret points (a byte offset into `command`). `logged()` is false for the silent kind.
struct Diagnostic {
  ErrorCode code = ErrorCode::kSilent;  // meaningful only when err != 0
  int err = 0;            // positive errno; 0 means "no error"
  int pos = 0;            // caret column inside `command`
  std::string command;    // the command as error_log shows it
  std::string_view subsystem = kLogUprobe;
  // Where the entry says it comes from when it is not a fixed subsystem (hist triggers:
  // "hist:GROUP:EVENT"); empty: `subsystem`.
  std::string location;

  bool ok() const { return err == 0; }
  bool logged() const { return err != 0 && code != ErrorCode::kSilent; }
  std::string_view message() const { return error_message(code); }
};

// One error_log entry, exactly as the kernel prints it:
//   "[%5llu.%06u] <subsystem>: error: <message>\n  Command: <command>\n<11+pos spaces>^\n"
// `timestamp_ns` is the writer's clock (CLOCK_MONOTONIC in the daemon).
std::string format_error_log_entry(uint64_t timestamp_ns, const Diagnostic& d);

}  // namespace probefs::events
