#!/usr/bin/env python3
"""README's command walks, run as written.

Every ```console block of README.md is run, top to bottom, as one shell session (as a
reader who follows README from the start would type them), against probefs installed
from the build tree under test into a scratch prefix, and what each command prints is
compared with what README shows after it. A README that drifts from the programs fails.

README's placeholders (its "Install" section names them) are put in for this run:
  /usr/local          the install prefix          -> a scratch prefix (cmake --install)
  /tmp/tr             the mount point             -> a scratch directory
  /home/me/probefs    the source checkout         -> the source directory under test
  build/              its build directory         -> the build directory under test

A block's lines that start with "$ " are commands (a trailing "\\" continues one); the
lines after a command, up to the next, are what it prints. Compared as follows:
  - numbers (decimal, hexadecimal, 0x...) stand for any number, runs of blanks for any
    run of blanks: pids, timestamps, addresses and counts vary between runs;
  - a line "..." stands for any number of lines;
  - a line of blanks and a caret "^" (error_log's) is compared exactly, column included;
  - when the lines differ only in how they are laid out in columns (ls at a terminal),
    the same words in any order are accepted;
  - output that ends with "^C" is that of a command which runs until interrupted
    (cat trace_pipe): it is stopped once it has printed as many lines as shown, and what
    it printed must begin with them;
  - "SCRIPT: line N: " in the shell's messages is read as README shows it, "bash: ".
A command must succeed unless README shows it failing (its output says "error", or
starts with "NAME: ").

Usage: readme_walks_test.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

SESSION_TIMEOUT = int(os.environ.get("README_WALKS_TIMEOUT", "900"))  # seconds for the whole session; every wait inside is bounded too
INTERRUPT_WAIT = 120   # seconds a "^C" command has to print what README shows


class Command:
    def __init__(self, text, expected, line):
        self.text = text          # the command as typed (continuations joined)
        self.expected = expected  # the lines README shows after it
        self.line = line          # README's line number, for messages

    @property
    def interrupted(self):
        return bool(self.expected) and self.expected[-1].strip() == "^C"


def console_blocks(readme):
    """Yields (first line number, lines) of each ```console block."""
    lines = readme.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            start = i + 2
            block = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                block.append(lines[i])
                i += 1
            yield start, block
        i += 1


def commands(readme):
    out = []
    for start, block in console_blocks(readme):
        i = 0
        while i < len(block):
            line = block[i]
            if not line.startswith("$ "):
                raise SystemExit(f"README.md:{start + i}: output before any command")
            text = line[2:]
            first = start + i
            while text.endswith("\\") and i + 1 < len(block):
                i += 1
                text += "\n" + block[i]  # bash reads the backslash-newline itself
            i += 1
            expected = []
            while i < len(block) and not block[i].startswith("$ "):
                expected.append(block[i])
                i += 1
            out.append(Command(text, expected, first))
    return out


def substitute(text, places, build):
    for old, new in places:
        text = text.replace(old, new)
    # build/ as a word of its own: a path relative to the checkout
    return re.sub(r"(?<![\w/.-])build/", build + "/", text)


# A number with the blanks that pad it: "[ 2310.42]" and "[43389.36]" are alike.
NUMBER = re.compile(r"[ \t]*(?:\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]*[0-9][0-9a-fA-F]*\b)")
CARET = re.compile(r"^ *\^$")


def normalize(line):
    line = re.sub(r"^\S+: line \d+: ", "bash: ", line)  # the shell, reading a script
    line = NUMBER.sub("N", line)
    return " ".join(line.split())


def lines_match(expected, actual):
    """expected (with "..." lines) against actual, line by line."""
    def match(e, a):
        if e == len(expected):
            return a == len(actual)
        if expected[e].strip() == "...":
            return any(match(e + 1, k) for k in range(a, len(actual) + 1))
        if a == len(actual):
            return False
        want, got = expected[e], actual[a]
        if CARET.match(want):
            if want.rstrip() != got.rstrip():
                return False
        elif normalize(want) != normalize(got):
            return False
        return match(e + 1, a + 1)
    return match(0, 0)


def words(lines):
    return sorted(w for line in lines for w in normalize(line).split())


def output_matches(cmd, expected, actual):
    if cmd.interrupted:
        shown = expected[:-1]  # what it printed before it was stopped, then anything
        if not shown or shown[-1].strip() != "...":
            shown = shown + ["..."]
        return lines_match(shown, actual)
    if lines_match(expected, actual):
        return True
    return "..." not in [e.strip() for e in expected] and words(expected) == words(actual)


def may_fail(expected):
    shown = [e for e in expected if e.strip() not in ("", "...", "^C")]
    if not shown:
        return False
    return any("error" in e.lower() for e in shown) or re.match(r"^[\w.-]+: ", shown[0])


def script(cmds, work):
    """The session: each command between markers, its status after it."""
    s = ["exec 2>&1", "set +e", ""]
    for i, c in enumerate(cmds):
        s.append(f"printf '\\n\\001CMD {i}\\n'")
        if c.interrupted:
            want = len([e for e in c.expected[:-1] if e.strip() != "..."])
            s += [
                # The file is there before the loop looks at it: the background's own
                # redirection may come after the first look.
                f": >'{work}/out.{i}'",
                f"( {c.text}\n) >'{work}/out.{i}' 2>&1 &",
                "__p=$!",
                f"__end=$((SECONDS + {INTERRUPT_WAIT}))",
                f"while [ \"$(wc -l <'{work}/out.{i}')\" -lt {want} ] && "
                "[ $SECONDS -lt $__end ] && kill -0 $__p 2>/dev/null; do sleep 0.05; done",
                "pkill -TERM -P $__p 2>/dev/null; kill -TERM $__p 2>/dev/null",
                "wait $__p 2>/dev/null",
                f"cat '{work}/out.{i}'",
                "true",
            ]
        else:
            s.append(c.text)
        s.append(f"printf '\\n\\001RC {i} %d\\n' $?")
    return "\n".join(s) + "\n"


def parse_session(out):
    results = {}
    current, buf = None, []
    for line in out.splitlines():
        m = re.match(r"^\x01(CMD|RC) (\d+)(?: (\d+))?$", line)
        if m and m.group(1) == "CMD":
            current, buf = int(m.group(2)), []
        elif m and m.group(1) == "RC" and current == int(m.group(2)):
            while buf and not buf[-1].strip():
                buf.pop()
            results[current] = (int(m.group(3)), buf)
            current = None
        elif current is not None:
            buf.append(line)
    return results


def unmount_under(work):
    with open("/proc/self/mounts") as f:
        points = [l.split()[1] for l in f]
    for p in reversed(points):
        if p.startswith(work + "/"):
            subprocess.run(["fusermount3", "-u", p], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run(["umount", "-l", p], timeout=30,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    src, build = (os.path.realpath(a) for a in sys.argv[1:3])
    with open(os.path.join(src, "README.md")) as f:
        cmds = commands(f.read())
    if not cmds:
        raise SystemExit("README.md has no console block")

    work = tempfile.mkdtemp(prefix="probefs-readme-")
    prefix, home = os.path.join(work, "prefix"), os.path.join(work, "home")
    os.makedirs(home)
    places = [("/home/me/probefs/build", build), ("/home/me/probefs", src),
              ("/usr/local", prefix), ("/tmp/tr", os.path.join(work, "tr"))]
    for c in cmds:
        c.text = substitute(c.text, places, build)
        c.expected = [substitute(e, places, build) for e in c.expected]

    proc = None
    try:
        subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True,
                       timeout=300, stdout=subprocess.DEVNULL)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PROBEFS_AGENT", "PROBEFS_TRACEFS_SHIM", "TRACEFS_PATH")}
        env.update(PATH=os.path.join(prefix, "bin") + ":" + env.get("PATH", "/usr/bin:/bin"),
                   HOME=home, LC_ALL="C.UTF-8", TERM="dumb")
        with open(os.path.join(work, "session.sh"), "w") as f:
            f.write(script(cmds, work))
        proc = subprocess.Popen(["bash", os.path.join(work, "session.sh")], cwd=home,
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=SESSION_TIMEOUT)
        except subprocess.TimeoutExpired:  # what finished is still reported, and the rest
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        results = parse_session(out.decode(errors="replace"))
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # README's background jobs too
            except ProcessLookupError:
                pass
            proc.wait()
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)

    failures = 0
    for i, c in enumerate(cmds):
        if i not in results:
            print(f"README.md:{c.line}: `{c.text}` did not finish in the session's "
                  f"{SESSION_TIMEOUT} s")
            failures += 1
            break
        status, actual = results[i]
        bad = []
        if status != 0 and not c.interrupted and not may_fail(c.expected):
            bad.append(f"exit status {status}")
        if not output_matches(c, c.expected, actual):
            bad.append("output differs")
        if bad:
            failures += 1
            print(f"README.md:{c.line}: `{c.text}`: {', '.join(bad)}")
            print("  README shows:")
            for e in c.expected:
                print("    " + e)
            print("  it printed:")
            for a in actual:
                print("    " + a)
    print(f"{len(cmds)} commands of README.md run, {failures} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
