# SPDX-License-Identifier: MIT
"""The man pages and the programs agree: every option (and command, and
case) that --help prints is in the page, and the other way round; every
function libkvcache exports is in libkvcache(3), and the other way round."""
import os
import re
import subprocess
import sys

SRC = os.environ["MESON_SOURCE_ROOT"]
MAN = os.path.join(SRC, "docs", "man")
bad = []


def page(name):
    return open(os.path.join(MAN, name + ".scd")).read()


def section(text, title):
    """The lines of a page's section, up to the next one."""
    m = re.search(r"^# %s\n(.*?)(?=^# |\Z)" % title, text, re.S | re.M)
    return m.group(1) if m else ""


def man_options(text, title="OPTIONS"):
    return set(re.findall(r"^\*(?:-[a-zA-Z]\*, \*)?--([a-z0-9_-]+)\*", section(text, title), re.M))


def help_text(argv):
    r = subprocess.run(argv + ["--help"], capture_output=True, text=True)
    return r.stdout + r.stderr


def compare(what, in_help, in_man):
    ignore = {"help", "version"}
    for x in sorted(in_help - in_man - ignore):
        bad.append("%s: --help has %s, the man page does not" % (what, x))
    for x in sorted(in_man - in_help - ignore):
        bad.append("%s: the man page has %s, --help does not" % (what, x))


# kvcached: the option lines of --help
h = help_text([os.environ["KVCACHED"]])
compare("kvcached", set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9][a-z0-9_-]*)", h, re.M)),
        man_options(page("kvcached.8")))

# kvcache-master
h = help_text([os.environ["KVCACHE_MASTER"]])
compare("kvcache-master", set(re.findall(r"^\s+--([a-z0-9][a-z0-9_-]*)\s", h, re.M)),
        man_options(page("kvcache-master.8"), "FLAGS"))

# kvcachectl: every --option anywhere in --help, and the commands
h = help_text([os.environ["KVCACHECTL"]])
text = page("kvcachectl.1")
compare("kvcachectl options", set(re.findall(r"--([a-z][a-z0-9-]*)", h)), man_options(text))
cmds = section(h.replace("Commands:", "# COMMANDS\n").replace("Options:", "# OPTIONS\n"),
               "COMMANDS")
compare("kvcachectl commands", set(re.findall(r"^  ([a-z]+)\b", cmds, re.M)),
        set(re.findall(r"^\*([a-z]+)\*", section(text, "COMMANDS"), re.M)))

# kvcache-bench: the options and cases of its usage
h = help_text([os.environ["KVCACHE_BENCH"]])
text = page("kvcache-bench.1")
compare("kvcache-bench options", set(re.findall(r"--([a-z][a-z0-9-]*)", h)), man_options(text))
compare("kvcache-bench cases", set(re.findall(r"kvcache-bench ([a-z]+)", h)),
        set(re.findall(r"^\*([a-z]+)\*", section(text, "CASES"), re.M)))

# libkvcache: the exported symbols
exported = set(re.findall(r"^\s+(kvc_[a-z_0-9]+);", open(
    os.path.join(SRC, "client", "libkvcache.map")).read(), re.M))
documented = set(re.findall(r"^\*.*?\b(kvc_[a-z_0-9]+)\(", page("libkvcache.3"), re.M))
compare("libkvcache", exported, documented)

if bad:
    print("\n".join(bad))
    sys.exit(1)
print("man pages: every option, command, case and function is in both")
