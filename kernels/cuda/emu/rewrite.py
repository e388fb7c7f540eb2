"""Source rewriting for the CUDA emulator: what g++ cannot parse in CUDA C++.

* ``Kernel<Args...><<<grid, block[, smem[, stream]]>>>(args...)`` becomes
  ``::keras_ecoc_emu::MakeLaunch(__FILE__, __LINE__, "Kernel<Args...>", grid,
  block, smem, stream).Run(Kernel<Args...>, args...)``. Template arguments
  may nest ``<>``; launches may span lines (line numbers are kept).
* ``extern __shared__ [__align__(N)] T name[];`` inside a kernel becomes
  ``T* const name = reinterpret_cast<T*>(::keras_ecoc_emu::DynamicSharedMemory());``.
  Any other ``__shared__`` (a static shared array) is outside the contract of
  kernels/cuda and is reported as an error.
* Optionally (switchable_barriers), the call on each line marked
  ``[barrier-mutation-test]`` (``__syncthreads();``, ``__syncwarp(...);`` or
  a wgmma group wait, ``ptx::wgmma_wait<N>();``) goes behind a run-time
  switch, so that one build runs every mutant of the test that a missing
  barrier or wait is caught.

Comments and string literals are never rewritten.
"""

from __future__ import annotations

import re

MARKER = "[barrier-mutation-test]"
_IDENT = re.compile(r"[A-Za-z0-9_:]")


class RewriteError(ValueError):
    """A construct of the CUDA source that the emulator does not accept."""


def code_mask(text: str) -> bytearray:
    """1 for each character of ``text`` that is code (not comment or literal)."""
    mask = bytearray(len(text))
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:i + 20]) if c == "R" else None
        if m and (i == 0 or not _IDENT.match(text[i - 1])):
            end = text.find(")" + m.group(1) + '"', i)
            i = n if end < 0 else end + len(m.group(1)) + 2
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                mask[i] = 1
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        mask[i] = 1
        i += 1
    return mask


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _match_close(text: str, mask: bytearray, start: int) -> int:
    """Index of the bracket closing the one at ``start`` (round/square/curly nest)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for i in range(start, len(text)):
        if not mask[i]:
            continue
        c = text[i]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack[-1] != c:
                raise RewriteError(f"unbalanced '{c}' at line {_line_of(text, i)}")
            stack.pop()
            if not stack:
                return i
    raise RewriteError(f"unclosed bracket from line {_line_of(text, start)}")


def _kernel_start(text: str, mask: bytearray, end: int) -> int:
    """Start of the kernel expression that ends just before ``end``."""
    i = end - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    if i >= 0 and text[i] == ">":  # template arguments, nested <> and ()
        stack = []  # closers seen; < and > count only outside () and []
        while i >= 0:
            c = text[i] if mask[i] else " "
            if c in ")]" or (c == ">" and (not stack or stack[-1] == ">")):
                stack.append(c)
            elif c in "([" or (c == "<" and stack and stack[-1] == ">"):
                stack.pop()
                if not stack:
                    break
            i -= 1
        if i < 0:
            raise RewriteError(f"unbalanced template arguments before <<< at line {_line_of(text, end)}")
        i -= 1
        while i >= 0 and text[i].isspace():
            i -= 1
    j = i
    while j >= 0 and _IDENT.match(text[j]):
        j -= 1
    if j == i:
        raise RewriteError(f"no kernel name before <<< at line {_line_of(text, end)}")
    return j + 1


def _rewrite_launches(text: str) -> tuple[str, list[str]]:
    mask = code_mask(text)
    sites = [m.start() for m in re.finditer(r"<<<", text) if mask[m.start()]]
    names = []
    for pos in reversed(sites):
        kstart = _kernel_start(text, mask, pos)
        kexpr = text[kstart:pos]
        # The launch configuration, up to >>> outside brackets.
        i, depth = pos + 3, 0
        while i < len(text):
            if mask[i]:
                if text.startswith(">>>", i) and depth == 0:
                    break
                if text[i] in "([{":
                    depth += 1
                elif text[i] in ")]}":
                    depth -= 1
            i += 1
        else:
            raise RewriteError(f"no >>> for the launch at line {_line_of(text, pos)}")
        config = text[pos + 3:i]
        j = i + 3
        while j < len(text) and text[j].isspace():
            j += 1
        if j >= len(text) or text[j] != "(":
            raise RewriteError(f"no argument list after >>> at line {_line_of(text, pos)}")
        close = _match_close(text, mask, j)
        args = text[j + 1:close]
        name = " ".join(kexpr.split())
        names.append(name)
        lost = text.count("\n", i, j)
        run_args = kexpr + ("," + args if args.strip() else "")
        repl = (f'::keras_ecoc_emu::MakeLaunch(__FILE__, __LINE__, "{name}", {config})'
                f".Run({run_args})" + "\n" * lost)
        text = text[:kstart] + repl + text[close + 1:]
    names.reverse()
    return text, names


def _enclosing_scopes(text: str, mask: bytearray, pos: int) -> list[str]:
    """Kinds ('namespace' or 'other') of the braces enclosing ``pos``."""
    stack = []
    for i in range(pos):
        if not mask[i]:
            continue
        if text[i] == "{":
            before = text[max(0, i - 200):i]
            kind = "namespace" if re.search(r'(namespace(\s+[\w:]+)?|extern\s+"C")\s*$', before) else "other"
            stack.append(kind)
        elif text[i] == "}" and stack:
            stack.pop()
    return stack


def _rewrite_shared(text: str, path: str) -> str:
    mask = code_mask(text)
    out = []
    last = 0
    for m in re.finditer(r"\bextern\s+(__align__\s*\(\s*\d+\s*\)\s*)?__shared__\b", text):
        if not mask[m.start()]:
            continue
        semi = text.find(";", m.end())
        decl = text[m.end():semi]
        decl = re.sub(r"__align__\s*\(\s*\d+\s*\)", " ", decl)
        dm = re.fullmatch(r"\s*(.*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*", decl, re.S)
        if not dm or not dm.group(1).strip():
            raise RewriteError(f"{path}:{_line_of(text, m.start())}: cannot parse the dynamic "
                               f"shared memory declaration {text[m.start():semi + 1]!r}")
        if "other" not in _enclosing_scopes(text, mask, m.start()):
            raise RewriteError(f"{path}:{_line_of(text, m.start())}: extern __shared__ at file "
                               "scope; the emulator needs it declared inside the kernel")
        ctype, name = " ".join(dm.group(1).split()), dm.group(2)
        repl = (f"{ctype}* const {name} = reinterpret_cast<{ctype}*>("
                f"::keras_ecoc_emu::DynamicSharedMemory());")
        repl += "\n" * text.count("\n", m.start(), semi + 1)
        out.append(text[last:m.start()])
        out.append(repl)
        last = semi + 1
    out.append(text[last:])
    text = "".join(out)
    mask = code_mask(text)
    for m in re.finditer(r"\b__shared__\b", text):
        if mask[m.start()]:
            raise RewriteError(f"{path}:{_line_of(text, m.start())}: a static __shared__ "
                               "variable; kernels/cuda uses dynamic shared memory only "
                               "(one extern __shared__ array per kernel)")
    return text


def kernel_names(text: str) -> list[str]:
    """Names of the __global__ functions (or function templates) defined in ``text``."""
    mask = code_mask(text)
    names = []
    for m in re.finditer(r"\b__global__\b", text):
        if not mask[m.start()]:
            continue
        head = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", text[m.end():m.end() + 400])
        nm = re.match(r"\s*(?:static\s+|inline\s+)*void\s+(?:__\w+\s+)*([A-Za-z_]\w*)\s*\(", head)
        if nm:
            names.append(nm.group(1))
    return names


def marked_barriers(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line carrying the barrier-mutation marker."""
    return [(i + 1, line) for i, line in enumerate(text.split("\n")) if MARKER in line]


_BARRIER_CALL = re.compile(r"(__syncthreads\s*\(\s*\)|__syncwarp\s*\([^;]*\)"
                           r"|ptx::wgmma_wait\s*<\s*\d+\s*>\s*\(\s*\))\s*;")


def switchable_barriers(text: str, first_index: int, path: str) -> str:
    """Puts each marked barrier of ``text`` behind the emulator's run-time switch.

    The I-th marked barrier of the sources (``first_index`` + its place in
    ``text``) becomes ``(keras_ecoc_emu_barrier_kept(I) ? CALL : (void)0);``
    on the same line. One build then serves every mutant of the
    barrier-deletion test: KERAS_ECOC_EMU_DELETE_BARRIER=I skips the I-th
    call at run time, which is what deleting it from the source does under
    the emulator (its barriers and waits are calls into the runtime), and
    leaves every other one in place.
    """
    lines = text.split("\n")
    index = first_index
    for line_no, line in marked_barriers(text):
        new, count = _BARRIER_CALL.subn(
            lambda m: f"(keras_ecoc_emu_barrier_kept({index}) ? {m.group(1)} : (void)0);",
            line, count=1)
        if count == 0:
            raise RewriteError(f"{path}:{line_no}: marked {MARKER} but has no __syncthreads(); "
                               f"__syncwarp(...); or ptx::wgmma_wait<N>(); call: {line.strip()!r}")
        lines[line_no - 1] = new
        index += 1
    return "\n".join(lines)


def rewrite(text: str, path: str, display_path: str | None = None) -> tuple[str, list[str]]:
    """Returns (g++-ready source, names of the kernels launched in it)."""
    text = _rewrite_shared(text, path)
    text, names = _rewrite_launches(text)
    line_directive = f'#line 1 "{display_path or path}"\n'
    return line_directive + text, names
