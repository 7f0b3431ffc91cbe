"""The ctypes layer against include/zpccl.h: struct layouts, enum values, one prototype per function, loading."""
from __future__ import annotations

import ctypes
import os
import pathlib
import re
import subprocess
import sys
import unittest

import zpccl
from zpccl import _lib, enums
from zpccl.enums import CONFIG_MAGIC, CONFIG_UNDEF_INT, UNIQUE_ID_BYTES, VERSION_CODE

from . import SOURCE_TREE

HEADER = SOURCE_TREE / "include" / "zpccl.h"


def header_text() -> str:
    if not HEADER.exists():
        raise unittest.SkipTest(f"{HEADER} not found (package used outside its source tree)")
    return HEADER.read_text()


class StructLayout(unittest.TestCase):
    def test_config_is_56_bytes_in_c_order(self) -> None:
        self.assertEqual(ctypes.sizeof(zpccl.Config), 56)
        names = [name for name, _ in zpccl.Config._fields_]
        self.assertEqual(names, ["size", "magic", "version", "backend", "ranksPerNode", "nodeId", "hpzSize",
                                 "weightBits", "gradBits", "blockSize", "blocking", "gradRounding", "gradSeed"])
        offsets = [getattr(zpccl.Config, name).offset for name in names]
        self.assertEqual(offsets, [0, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52])

    def test_grad_options_match_the_header(self) -> None:
        body = re.search(r"typedef struct \{([^}]*)\} zpGradOptions_t;", header_text(), re.S).group(1)
        c_fields = re.findall(r"^\s*(size_t|unsigned int|int|void\*)\s+(\w+);", body, re.M)
        ctypes_of = {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int,
                     "void*": ctypes.c_void_p}
        self.assertEqual([(n, ctypes_of[t]) for t, n in c_fields], list(zpccl.GradOptions._fields_))
        self.assertEqual(ctypes.sizeof(zpccl.GradOptions), 80)
        g = zpccl.GradOptions.initializer()
        self.assertEqual((g.size, g.version, g.bits, g.rounding, g.seed, g.residual, g.residualType),
                         (80, VERSION_CODE, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, None, 9))
        self.assertIn("#define ZP_GRAD_OPTIONS_MAGIC 0x7a70676fu", header_text())

    def test_transport_matches_the_header(self) -> None:
        def fields(struct: str) -> list[str]:
            body = re.search(r"typedef struct \{([^{}]*)\} " + struct + ";", text).group(1)
            body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
            names = []
            for decl in filter(None, (d.strip() for d in body.split(";"))):
                pointer = re.match(r"[\w\s]+\(\*(\w+)\)", decl)  # a callback
                names.append(pointer.group(1) if pointer else re.findall(r"(\w+)\s*(?:\[\w+\])?$", decl)[0])
            return names

        text = header_text()
        self.assertEqual(fields("zpTransport_t"), [name for name, _ in _lib.Transport._fields_])
        self.assertEqual(fields("zpTransportCall_t"), [name for name, _ in _lib.TransportCall._fields_])
        self.assertEqual(ctypes.sizeof(_lib.Transport), 56)
        self.assertIn("#define ZP_TRANSPORT_MAGIC 0x7a707472u", text)
        self.assertIn(f"#define ZP_TRANSPORT_ERROR_BYTES {zpccl.enums.TRANSPORT_ERROR_BYTES}", text)
        self.assertEqual(zpccl.enums.TRANSPORT_MAGIC.to_bytes(4, "big"), b"zptr")

    def test_config_fields_match_the_header(self) -> None:
        body = re.search(r"typedef struct \{(.*?)\} zpConfig_t;", header_text(), re.S).group(1)
        c_fields = re.findall(r"^\s*(size_t|unsigned int|int)\s+(\w+);", body, re.M)
        ctypes_of = {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int}
        self.assertEqual([(n, ctypes_of[t]) for t, n in c_fields], list(zpccl.Config._fields_))

    def test_initializer_matches_zp_config_initializer(self) -> None:
        c = zpccl.Config.initializer()
        self.assertEqual((c.size, c.magic, c.version), (56, CONFIG_MAGIC, VERSION_CODE))
        for name in zpccl.Config.INT_FIELDS:
            self.assertEqual(getattr(c, name), CONFIG_UNDEF_INT, name)
        self.assertEqual(CONFIG_UNDEF_INT, -(2**31))
        self.assertEqual(CONFIG_MAGIC.to_bytes(4, "big"), b"zpco")
        text = header_text()
        self.assertIn("#define ZP_CONFIG_MAGIC 0x7a70636fu", text)
        self.assertIn("#define ZP_CONFIG_UNDEF_INT (-2147483647 - 1)", text)
        init = re.search(r"#define ZP_CONFIG_INITIALIZER(.*?)\n\n", text, re.S).group(1)
        self.assertEqual(init.count("ZP_CONFIG_UNDEF_INT"), len(zpccl.Config.INT_FIELDS))

    def test_unique_id_and_options(self) -> None:
        self.assertEqual(ctypes.sizeof(zpccl.UniqueId), UNIQUE_ID_BYTES)
        self.assertEqual(ctypes.sizeof(zpccl.QuantOptions), 8)
        raw = bytes(range(128))
        self.assertEqual(zpccl.UniqueId.from_bytes(raw, "t").to_bytes(), raw)  # NUL bytes survive

    def test_versions_agree(self) -> None:
        text = header_text()
        major, minor, patch = (int(re.search(rf"#define ZPCCL_{k} (\d+)", text).group(1))
                               for k in ("MAJOR", "MINOR", "PATCH"))
        self.assertEqual(VERSION_CODE, major * 10000 + minor * 100 + patch)
        self.assertEqual(zpccl.version(), VERSION_CODE)


class Enums(unittest.TestCase):
    def c_enum(self, typedef: str) -> dict[str, int]:
        body = re.search(r"typedef enum (?:ZP_ENUM_INT )?\{([^}]*)\}\s*" + typedef + ";", header_text(), re.S).group(1)
        return {name: int(value) for name, value in re.findall(r"(zp\w+)\s*=\s*(\d+)", body)}

    def check(self, typedef: str, enum: type, counter: str) -> None:
        c = self.c_enum(typedef)
        c.pop(counter)
        py = {"zp" + "".join(w.capitalize() for w in name.split("_")): int(v) for name, v in enum.__members__.items()}
        # Python spells FLOAT8E4M3 / BFLOAT16 / FLOAT16 from the C names without case: compare case-insensitively.
        self.assertEqual({k.lower(): v for k, v in c.items()}, {k.lower(): v for k, v in py.items()})

    def test_result(self) -> None:
        self.check("zpResult_t", zpccl.Result, "zpNumResults")
        self.assertEqual(zpccl.Result.INVALID_ARGUMENT.c_name, "zpInvalidArgument")

    def test_data_type(self) -> None:
        self.check("zpDataType_t", zpccl.DataType, "zpNumTypes")
        self.assertEqual((zpccl.DataType.BFLOAT16, zpccl.DataType.FLOAT16, zpccl.DataType.FLOAT32), (9, 6, 7))

    def test_red_op(self) -> None:
        self.check("zpRedOp_t", zpccl.RedOp, "zpNumOps")

    def test_backend(self) -> None:
        body = re.search(r"typedef enum (?:ZP_ENUM_INT )?\{([^}]*)\}\s*zpBackend_t;", header_text(), re.S).group(1)
        c = {n.lower(): int(v) for n, v in re.findall(r"(zp\w+)\s*=\s*(\d+)", body)}
        self.assertEqual(c, {"zpbackend" + m.name.lower(): int(m) for m in zpccl.Backend})

    def test_dtype_mapping(self) -> None:
        import numpy as np

        r = zpccl.resolve_dtype
        self.assertEqual(r(np.float16, "t"), 6)
        self.assertEqual(r(np.float32, "t"), 7)
        self.assertEqual(r("bfloat16", "t"), 9)
        self.assertEqual(r("bf16", "t"), 9)
        self.assertEqual(r(np.int8, "t"), 0)
        self.assertEqual(r(np.dtype("uint64"), "t"), 5)
        self.assertEqual(r(zpccl.DataType.FLOAT8E5M2, "t"), 11)
        with self.assertRaisesRegex(ValueError, "t: dtype int16 has no zpDataType_t"):
            r(np.int16, "t")


class Bounds(unittest.TestCase):
    """The format's bounds: zpccl.enums holds the header's values, and the library refuses exactly what they
    exclude (each bound and its neighbours), as Python's own checks do."""

    NAMES = {"BITS_INT4": enums.BITS_INT4, "BITS_INT8": enums.BITS_INT8, "MIN_BLOCK_SIZE": enums.MIN_BLOCK_SIZE,
             "MAX_BLOCK_SIZE": enums.MAX_BLOCK_SIZE, "PAYLOAD_ALIGN": enums.PAYLOAD_ALIGN}

    def test_enums_hold_the_headers_values(self) -> None:
        defined = dict(re.findall(r"^#define ZP_(\w+) (\d+)$", header_text(), re.M))
        self.assertEqual({name: int(defined[name]) for name in self.NAMES if name in defined}, self.NAMES)
        self.assertEqual(enums.QUANT_BITS, (enums.BITS_INT4, enums.BITS_INT8))

    @staticmethod
    def library_takes(bits: int, block_size: int) -> str:
        """"" when zpQuantPayloadSize takes (bits, block_size), else its message (Python checks nothing first)."""
        try:
            zpccl.payload_size(100, bits, block_size)
        except zpccl.ZpcclError as e:
            return e.message
        return ""

    @staticmethod
    def python_takes(bits: int, block_size: int) -> str:
        try:
            zpccl.comm._check_quant_params(bits, block_size, "t")
        except zpccl.ZpcclValueError as e:
            return e.message
        return ""

    def test_library_takes_the_bounds_and_refuses_their_neighbours(self) -> None:
        lo, hi = enums.MIN_BLOCK_SIZE, enums.MAX_BLOCK_SIZE
        for block in (lo // 2, lo - 1, lo, lo + 1, 2 * lo, hi // 2, hi - 1, hi, hi + 1, 2 * hi):
            want = block in (lo, 2 * lo, hi // 2, hi)
            self.assertEqual(enums.is_block_size(block), want, block)
            said = self.library_takes(enums.BITS_INT8, block)
            self.assertEqual(said == "", want, f"blockSize {block}: {said!r}")
            self.assertEqual(self.python_takes(enums.BITS_INT8, block) == "", want, f"block_size {block}")
            if not want:
                self.assertIn(f"blockSize {block} must be {enums.BLOCK_SIZE_RULE}", said)
        for bits in range(enums.BITS_INT4 - 1, enums.BITS_INT8 + 2):
            want = bits in enums.QUANT_BITS
            self.assertEqual(enums.is_bits(bits), want, bits)
            said = self.library_takes(bits, lo)
            self.assertEqual(said == "", want, f"bits {bits}: {said!r}")
            self.assertEqual(self.python_takes(bits, lo) == "", want, f"bits {bits}")
            if not want:
                self.assertIn(f"bits {bits} must be {enums.BITS_RULE}", said)

    def test_a_communicators_config_takes_the_bounds(self) -> None:
        def init(**config: int) -> str:
            try:
                zpccl.Comm(1, 0, zpccl.get_unique_id(), backend="host", **config).close()
            except zpccl.ZpcclError as e:
                return e.message
            return ""

        self.assertEqual(init(block_size=enums.MAX_BLOCK_SIZE, weight_bits=enums.BITS_INT4,
                              grad_bits=enums.BITS_INT8), "")
        self.assertEqual(init(block_size=enums.MIN_BLOCK_SIZE), "")
        self.assertIn("config->blockSize %d must be" % (2 * enums.MAX_BLOCK_SIZE),
                      init(block_size=2 * enums.MAX_BLOCK_SIZE))
        self.assertIn("config->blockSize %d must be" % (enums.MIN_BLOCK_SIZE // 2),
                      init(block_size=enums.MIN_BLOCK_SIZE // 2))
        self.assertIn("config->gradBits %d must be" % (enums.BITS_INT8 + 1), init(grad_bits=enums.BITS_INT8 + 1))

    def test_payloads_are_aligned_to_the_bound(self) -> None:
        # One element: a 4-byte scale and a code, each region padded to the alignment.
        self.assertEqual(zpccl.payload_size(1, enums.BITS_INT8, enums.MIN_BLOCK_SIZE), 2 * enums.PAYLOAD_ALIGN)
        for count in (1, 33, 1000, 4097):
            self.assertEqual(zpccl.payload_size(count, enums.BITS_INT4, enums.MIN_BLOCK_SIZE) % enums.PAYLOAD_ALIGN, 0)



class ConfigDefaults(unittest.TestCase):
    """A config's code widths and block size left unset take the library's defaults (src/comm.h's Settings, as
    include/zpccl.h documents them at zpConfig_t): ZeroPlusPlusPolicy's, so that a communicator made from a bare
    config quantizes as a policy made without arguments says."""

    FIELDS = {"weightBits": "weight_bits", "gradBits": "grad_bits", "blockSize": "block_size"}

    def policys(self) -> dict[str, int]:
        policy = zpccl.ZeroPlusPlusPolicy()
        return {c: getattr(policy, py) for c, py in self.FIELDS.items()}

    def test_the_header_documents_the_policys_defaults(self) -> None:
        body = re.search(r"typedef\s+struct\s*\{(.*?)\}\s*zpConfig_t\s*;", header_text(), re.S).group(1)
        # "int weightBits; /* ... Default 8 */": a field, then its comment (possibly over lines) up to "Default N".
        doc = dict(re.findall(r"\bint\s+(\w+)\s*;\s*/\*(?:(?!\*/).)*?\bDefault\s+(-?\d+)\b", body, re.S))
        self.assertEqual({c: int(doc[c]) for c in self.FIELDS if c in doc}, self.policys())

    def test_the_librarys_settings_default_to_the_policys(self) -> None:
        path = SOURCE_TREE / "src" / "comm.h"
        if not path.exists():
            raise unittest.SkipTest(f"{path} not found (package used outside its source tree)")
        body = re.search(r"\bstruct\s+Settings\s*\{(.*?)\};", path.read_text(), re.S).group(1)
        settings = dict(re.findall(r"\bint\s+(\w+)\s*=\s*(-?\d+)\s*;", body))
        self.assertEqual({c: int(settings[c]) for c in self.FIELDS if c in settings}, self.policys())


class Prototypes(unittest.TestCase):
    def test_every_header_function_is_declared(self) -> None:
        declared = set(re.findall(r"^(?:zpResult_t|const char\*)\s+(zp\w+)\(", header_text(), re.M))
        self.assertEqual(len(declared), 37)
        self.assertEqual(declared, set(_lib.PROTOTYPES))

    def test_argument_counts_match_the_header(self) -> None:
        for name, args in re.findall(r"^(?:zpResult_t|const char\*)\s+(zp\w+)\((.*?)\);", header_text(),
                                     re.M | re.S):
            self.assertEqual(len(args.split(",")), len(_lib.PROTOTYPES[name][1]), name)

    def test_pointers_and_counts_are_64_bit(self) -> None:
        for name, (restype, argtypes) in _lib.PROTOTYPES.items():
            self.assertIn(restype, (ctypes.c_int, ctypes.c_char_p), name)
            for t in argtypes:
                self.assertNotIn(t, (ctypes.c_long, ctypes.c_uint), name)  # sizes are size_t, handles void*
        L = _lib.lib()
        for name in _lib.PROTOTYPES:
            fn = getattr(L, name)
            self.assertEqual(fn.argtypes, _lib.PROTOTYPES[name][1], name)

    def test_error_strings(self) -> None:
        self.assertEqual(_lib.error_string(0), "no error")
        self.assertEqual(_lib.error_string(99), "unknown result code")


class Loading(unittest.TestCase):
    def run_python(self, code: str, **env: str) -> subprocess.CompletedProcess:
        full_env = dict(os.environ, **env)
        full_env["PYTHONPATH"] = str(pathlib.Path(zpccl.__file__).resolve().parents[1])
        return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                              timeout=60)

    def test_missing_library_is_a_clear_error(self) -> None:
        out = self.run_python("import zpccl\ntry:\n zpccl.version()\nexcept zpccl.LibraryNotFoundError as e:\n"
                              " print('ERR', e)", ZPCCL_LIBRARY="/nonexistent/libzpccl.so")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("ERR zpccl: cannot load libzpccl.so", out.stdout)
        self.assertIn("/nonexistent/libzpccl.so (no such file)", out.stdout)
        self.assertIn("ZPCCL_LIBRARY", out.stdout)

    def test_library_folder_in_env(self) -> None:
        folder = os.path.dirname(zpccl.library_path())
        out = self.run_python("import zpccl; print(zpccl.library_path(), zpccl.version())", ZPCCL_LIBRARY=folder)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith(os.path.join(folder, "libzpccl.so")), out.stdout)

    def test_import_does_not_load_torch(self) -> None:
        out = self.run_python("import sys, zpccl; zpccl.version(); print('torch' in sys.modules)")
        self.assertEqual(out.stdout.strip(), "False", out.stderr)


if __name__ == "__main__":
    unittest.main()
