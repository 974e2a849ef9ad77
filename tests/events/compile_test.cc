// Compile, interpret, format: format files and trace lines against the reference captures
// (01-trace-output.txt, 01b-fetch-faults.txt, 01c-file-offset-fetch.txt, 02-event-files.txt,
// 02b-readback-normalization.txt). The kernel's `DBZff` flag artefact is not reproduced: a
// user thread's flags read ".....".
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "events/compile.h"
#include "events/fetch.h"
#include "events/memory_reader.h"
#include "events/output.h"
#include "events/parse.h"

namespace probefs::events {
namespace {

const std::string kProg = "/srv/reference/kernel-tracefs-caps/prog/probetest";

CompiledEvent compile_line(const std::string& line) {
  ParseResult r = parse_dynamic_command(line);
  EXPECT_EQ(r.status, ParseStatus::kDefine) << line << ": " << r.error.message();
  CompiledEvent ev;
  Diagnostic err;
  EXPECT_TRUE(compile(r.def, nullptr, &ev, &err)) << line;
  return ev;
}

const char kHeader[] =
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";

TEST(FormatFile, RefAdd3) {
  CompiledEvent ev = compile_line(
      "p:uprobes/ref_add3 " + kProg +
      ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 c64=%dx:s64 imm=\\123 imms=\\\"hi\"");
  EXPECT_EQ(format_file(ev, 2327),
            std::string("name: ref_add3\nID: 2327\nformat:\n") + kHeader +
                "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:u64 a;\toffset:16;\tsize:8;\tsigned:0;\n"
                "\tfield:u32 b;\toffset:24;\tsize:4;\tsigned:0;\n"
                "\tfield:s32 c;\toffset:28;\tsize:4;\tsigned:1;\n"
                "\tfield:u16 cx;\toffset:32;\tsize:2;\tsigned:0;\n"
                "\tfield:s64 c64;\toffset:34;\tsize:8;\tsigned:1;\n"
                "\tfield:u64 imm;\toffset:42;\tsize:8;\tsigned:0;\n"
                "\tfield:__data_loc char[] imms;\toffset:50;\tsize:4;\tsigned:1;\n"
                "\n"
                "print fmt: \"(%lx) a=0x%Lx b=%u c=%d cx=0x%x c64=%Ld imm=0x%Lx "
                "imms=\\\"%s\\\"\", REC->__probe_ip, REC->a, REC->b, REC->c, REC->cx, "
                "REC->c64, REC->imm, __get_str(imms)\n");
}

const std::string kRefMix =
    "p:uprobes/ref_mix " + kProg +
    ":0x1380 x=%di:s64 str=+0(%si):string name=+4(%dx):string ustr=+0(%si):ustring "
    "bytes=+16(%dx):u8[4] xb=+16(%dx):x8[4] sb=+16(%dx):s8[4] flags=+0(%dx):x32 "
    "bf=+0(%dx):b4@2/32 bf8=+0(%dx):b4@4/8 big=+24(%dx):s64 st=$stack st0=$stack0 "
    "st1=$stack1 comm=$comm cnt=@+0x4038:s32 cntx=@+0x4038:x32 ch=+4(%dx):char "
    "chs=+4(%dx):char[3] gmsg=+0(@+0x4040):string";

TEST(FormatFile, RefMix) {
  CompiledEvent ev = compile_line(kRefMix);
  EXPECT_EQ(format_file(ev, 2328),
            std::string("name: ref_mix\nID: 2328\nformat:\n") + kHeader +
                "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:s64 x;\toffset:16;\tsize:8;\tsigned:1;\n"
                "\tfield:__data_loc char[] str;\toffset:24;\tsize:4;\tsigned:1;\n"
                "\tfield:__data_loc char[] name;\toffset:28;\tsize:4;\tsigned:1;\n"
                "\tfield:__data_loc char[] ustr;\toffset:32;\tsize:4;\tsigned:1;\n"
                "\tfield:u8 bytes[];\toffset:36;\tsize:4;\tsigned:0;\n"
                "\tfield:u8 xb[];\toffset:40;\tsize:4;\tsigned:0;\n"
                "\tfield:s8 sb[];\toffset:44;\tsize:4;\tsigned:1;\n"
                "\tfield:u32 flags;\toffset:48;\tsize:4;\tsigned:0;\n"
                "\tfield:u32 bf;\toffset:52;\tsize:4;\tsigned:0;\n"
                "\tfield:u8 bf8;\toffset:56;\tsize:1;\tsigned:0;\n"
                "\tfield:s64 big;\toffset:57;\tsize:8;\tsigned:1;\n"
                "\tfield:u64 st;\toffset:65;\tsize:8;\tsigned:0;\n"
                "\tfield:u64 st0;\toffset:73;\tsize:8;\tsigned:0;\n"
                "\tfield:u64 st1;\toffset:81;\tsize:8;\tsigned:0;\n"
                "\tfield:__data_loc char[] comm;\toffset:89;\tsize:4;\tsigned:1;\n"
                "\tfield:s32 cnt;\toffset:93;\tsize:4;\tsigned:1;\n"
                "\tfield:u32 cntx;\toffset:97;\tsize:4;\tsigned:0;\n"
                "\tfield:u8 ch;\toffset:101;\tsize:1;\tsigned:0;\n"
                "\tfield:u8 chs[];\toffset:102;\tsize:3;\tsigned:0;\n"
                "\tfield:__data_loc char[] gmsg;\toffset:105;\tsize:4;\tsigned:1;\n"
                "\n"
                "print fmt: \"(%lx) x=%Ld str=\\\"%s\\\" name=\\\"%s\\\" ustr=\\\"%s\\\" "
                "bytes={%u,%u,%u,%u} xb={0x%x,0x%x,0x%x,0x%x} sb={%d,%d,%d,%d} flags=0x%x "
                "bf=%u bf8=%u big=%Ld st=0x%Lx st0=0x%Lx st1=0x%Lx comm=\\\"%s\\\" cnt=%d "
                "cntx=0x%x ch='%c' chs={'%c','%c','%c'} gmsg=\\\"%s\\\"\", REC->__probe_ip, "
                "REC->x, __get_str(str), __get_str(name), __get_str(ustr), REC->bytes[0], "
                "REC->bytes[1], REC->bytes[2], REC->bytes[3], REC->xb[0], REC->xb[1], "
                "REC->xb[2], REC->xb[3], REC->sb[0], REC->sb[1], REC->sb[2], REC->sb[3], "
                "REC->flags, REC->bf, REC->bf8, REC->big, REC->st, REC->st0, REC->st1, "
                "__get_str(comm), REC->cnt, REC->cntx, REC->ch, REC->chs[0], REC->chs[1], "
                "REC->chs[2], __get_str(gmsg)\n");
}

TEST(FormatFile, ReturnAndNoArgs) {
  CompiledEvent ret = compile_line("r:uprobes/ref_negs_ret " + kProg +
                                   ":0x13c0 rv=$retval rvs=$retval:s64 rvx=$retval:x32 "
                                   "comm=$comm");
  EXPECT_EQ(format_file(ret, 2330),
            std::string("name: ref_negs_ret\nID: 2330\nformat:\n") + kHeader +
                "\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n"
                "\tfield:u64 rv;\toffset:24;\tsize:8;\tsigned:0;\n"
                "\tfield:s64 rvs;\toffset:32;\tsize:8;\tsigned:1;\n"
                "\tfield:u32 rvx;\toffset:40;\tsize:4;\tsigned:0;\n"
                "\tfield:__data_loc char[] comm;\toffset:44;\tsize:4;\tsigned:1;\n"
                "\n"
                "print fmt: \"(%lx <- %lx) rv=0x%Lx rvs=%Ld rvx=0x%x comm=\\\"%s\\\"\", "
                "REC->__probe_func, REC->__probe_ret_ip, REC->rv, REC->rvs, REC->rvx, "
                "__get_str(comm)\n");
  CompiledEvent none = compile_line("p:uprobes/ref_noargs " + kProg + ":0x1370");
  EXPECT_EQ(format_file(none, 2333),
            std::string("name: ref_noargs\nID: 2333\nformat:\n") + kHeader +
                "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                "\n"
                "print fmt: \"(%lx)\", REC->__probe_ip\n");
}

TEST(FormatFile, CharFaultsAndUnnamed) {
  CompiledEvent ch = compile_line("p:uprobes/ref_char " + kProg +
                                  ":0x13b0 c=%di:char h=%si:s16 u=%dx:u16 cx=%di:x8 s8=%di:s8 "
                                  "u8=%di:u8");
  EXPECT_EQ(ch.print_fmt,
            "\"(%lx) c='%c' h=%d u=%u cx=0x%x s8=%d u8=%u\", REC->__probe_ip, REC->c, REC->h, "
            "REC->u, REC->cx, REC->s8, REC->u8");
  CompiledEvent f = compile_line(
      "p:uprobes/ref_fault " + kProg +
      ":0x1370 a=%di badu32=+0(%di):u32 badx64=+0(%di) bads=+0(%di):string "
      "badus=+0(%di):ustring badarr=+0(%di):u8[2] badbf=+0(%di):b4@2/32 badchr=+0(%di):char "
      "good=%si:s32");
  std::string text = format_file(f, 2334);
  EXPECT_NE(text.find("\tfield:u8 badarr[];\toffset:44;\tsize:2;\tsigned:0;\n"), std::string::npos);
  EXPECT_NE(text.find("\tfield:s32 good;\toffset:51;\tsize:4;\tsigned:1;\n"), std::string::npos);
  EXPECT_EQ(f.print_fmt,
            "\"(%lx) a=0x%Lx badu32=%u badx64=0x%Lx bads=\\\"%s\\\" badus=\\\"%s\\\" "
            "badarr={%u,%u} badbf=%u badchr='%c' good=%d\", REC->__probe_ip, REC->a, "
            "REC->badu32, REC->badx64, __get_str(bads), __get_str(badus), REC->badarr[0], "
            "REC->badarr[1], REC->badbf, REC->badchr, REC->good");
  CompiledEvent ev9 = compile_line("p:grp1/ev9 " + kProg + ":0x1370 %di +0(%si):u8 $comm");
  EXPECT_EQ(ev9.print_fmt,
            "\"(%lx) arg1=0x%Lx arg2=%u arg3=\\\"%s\\\"\", REC->__probe_ip, REC->arg1, "
            "REC->arg2, __get_str(arg3)");
  CompiledEvent e12f = compile_line("p:uprobes/e12f " + kProg + ":0x1370 a=+0(%si):b2@1/8[2]");
  EXPECT_EQ(e12f.print_fmt, "\"(%lx) a={%u,%u}\", REC->__probe_ip, REC->a[0], REC->a[1]");
  CompiledEvent e19d = compile_line("p:uprobes/e19d " + kProg + ":0x1370 a=\\123:string");
  EXPECT_EQ(e19d.print_fmt, "\"(%lx) a=\\\"%s\\\"\", REC->__probe_ip, __get_str(a)");
}

// ------------------------------------------------------------------------ trace lines

struct Hit {
  PtRegs regs{};
  HitContext ctx;
  FakeMemoryReader mem;
  Hit() {
    ctx.regs = &regs;
    ctx.comm = "probetest";
    ctx.pid = 5455;
  }
};

std::string line_for(const CompiledEvent& ev, Hit& h, uint64_t ts_ns, Symbolizer* sym = nullptr,
                     uint32_t cpu = 1) {
  uint8_t rec[8192];
  uint32_t n = write_record(view_of(ev.program), h.ctx, h.mem, rec, sizeof rec);
  EXPECT_GT(n, 0u);
  std::string out;
  LineContext lc{"probetest", h.ctx.pid, cpu, ts_ns};
  EXPECT_TRUE(format_trace_line(out, ev, lc, rec, n, sym));
  return out;
}

TEST(TraceLine, RefAdd3AndNoArgs) {
  CompiledEvent add3 = compile_line(
      "p:uprobes/ref_add3 " + kProg +
      ":0x1370 a=%di b=%si:u32 c=%dx:s32 cx=%dx:x16 c64=%dx:s64 imm=\\123 imms=\\\"hi\"");
  Hit h;
  h.ctx.ip = 0x55ded62af370;
  h.regs.di = 1;
  h.regs.si = 10;
  h.regs.dx = 0xfffffffbu;
  EXPECT_EQ(line_for(add3, h, 426361158000),
            "       probetest-5455    [001] .....   426.361158: ref_add3: (0x55ded62af370) a=0x1 "
            "b=10 c=-5 cx=0xfffb c64=4294967291 imm=0x7b imms=(fault)\n");
  CompiledEvent none = compile_line("p:uprobes/ref_noargs " + kProg + ":0x1370");
  EXPECT_EQ(line_for(none, h, 426361053000),
            "       probetest-5455    [001] .....   426.361053: ref_noargs: (0x55ded62af370)\n");
  // Rounded to the nearest microsecond, as the kernel does.
  EXPECT_EQ(line_for(none, h, 426361052500),
            "       probetest-5455    [001] .....   426.361053: ref_noargs: (0x55ded62af370)\n");
}

TEST(TraceLine, RefMix) {
  CompiledEvent mix = compile_line(kRefMix);
  Hit h;
  const uint64_t base = 0x55ded62ae000;  // load address: probe ip - probe file offset
  h.ctx.ip = base + 0x1380;
  h.regs.di = 101;
  h.regs.si = 0x10000;
  h.regs.dx = 0x20000;
  h.regs.sp = 0x7ffe9dda2b18;
  h.mem.map_string(0x10000, "hello-1");
  uint8_t st[40] = {};
  uint32_t flags = 0xa5c3;
  std::memcpy(st, &flags, 4);
  std::memcpy(st + 4, "recname", 8);
  uint8_t bytes[4] = {1, 2, 254, 255};
  std::memcpy(st + 16, bytes, 4);
  int64_t big = -1234567890123;
  std::memcpy(st + 24, &big, 8);
  h.mem.map(0x20000, st, sizeof st);
  uint64_t stack[2] = {0x55ded62af17b, 0};
  h.mem.map(h.regs.sp, stack, sizeof stack);
  int32_t counter = 4661;
  h.mem.map(base + 0x4038, &counter, 4);
  uint64_t gmsg_ptr = 0x30000;
  h.mem.map(base + 0x4040, &gmsg_ptr, 8);
  h.mem.map_string(0x30000, "global-msg");
  EXPECT_EQ(line_for(mix, h, 426361180000),
            "       probetest-5455    [001] .....   426.361180: ref_mix: (0x55ded62af380) x=101 "
            "str=\"hello-1\" name=\"recname\" ustr=\"hello-1\" bytes={1,2,254,255} "
            "xb={0x1,0x2,0xfe,0xff} sb={1,2,-2,-1} flags=0xa5c3 bf=0 bf8=12 big=-1234567890123 "
            "st=0x7ffe9dda2b18 st0=0x55ded62af17b st1=0x0 comm=\"probetest\" cnt=4661 "
            "cntx=0x1235 ch='r' chs={'r','e','c'} gmsg=\"global-msg\"\n");
}

TEST(TraceLine, CharReturnAndNegatives) {
  CompiledEvent ch = compile_line("p:uprobes/ref_char " + kProg +
                                  ":0x13b0 c=%di:char h=%si:s16 u=%dx:u16 cx=%di:x8 s8=%di:s8 "
                                  "u8=%di:u8");
  Hit h;
  h.ctx.ip = 0x55ded62af3b0;
  h.regs.di = 'B';
  h.regs.si = static_cast<uint64_t>(-301);
  h.regs.dx = 65001;
  EXPECT_EQ(line_for(ch, h, 426361181000),
            "       probetest-5455    [001] .....   426.361181: ref_char: (0x55ded62af3b0) c='B' "
            "h=-301 u=65001 cx=0x42 s8=66 u8=66\n");
  CompiledEvent ret = compile_line("r:uprobes/ref_negs_ret " + kProg +
                                   ":0x13c0 rv=$retval rvs=$retval:s64 rvx=$retval:x32 "
                                   "comm=$comm");
  h.ctx.ip = 0x55ded62af3c0;
  h.ctx.ret_ip = 0x55ded62af1ac;
  h.regs.ax = 2000000014;
  EXPECT_EQ(line_for(ret, h, 426361283000),
            "       probetest-5455    [001] .....   426.361283: ref_negs_ret: (0x55ded62af1ac <- "
            "0x55ded62af3c0) rv=0x7735940e rvs=2000000014 rvx=0x7735940e comm=\"probetest\"\n");
  CompiledEvent negs = compile_line("p:uprobes/ref_negs " + kProg + ":0x13c0 v=%di:s64");
  h.regs.di = static_cast<uint64_t>(-1000000007);
  EXPECT_EQ(line_for(negs, h, 426361201000),
            "       probetest-5455    [001] .....   426.361201: ref_negs: (0x55ded62af3c0) "
            "v=-1000000007\n");
}

TEST(TraceLine, FaultsAndFileOffsets) {
  CompiledEvent f = compile_line(
      "p:uprobes/ref_fault " + kProg +
      ":0x1370 a=%di badu32=+0(%di):u32 badx64=+0(%di) bads=+0(%di):string "
      "badus=+0(%di):ustring badarr=+0(%di):u8[2] badbf=+0(%di):b4@2/32 badchr=+0(%di):char "
      "good=%si:s32");
  Hit h;
  h.ctx.pid = 5677;
  h.ctx.ip = 0x55a95484f370;
  h.regs.di = 1;
  h.regs.si = 10;
  std::string expected =
      "       probetest-5677    [000] .....   452.599574: ref_fault: (0x55a95484f370) a=0x1 "
      "badu32=0 badx64=0x0 bads=(fault) badus=(fault) badarr={0,0} badbf=0 badchr='";
  expected += '\0';
  expected += "' good=10\n";
  EXPECT_EQ(line_for(f, h, 452599574000, nullptr, 0), expected);

  CompiledEvent big = compile_line("p:uprobes/ref_big " + kProg +
                                   ":0x1380 arr=+0(%si):x8[16] s=+0(%si):string "
                                   "s2=+0(%si):string c=+4(%dx):char[8]");
  Hit b;
  b.ctx.pid = 5681;
  b.ctx.ip = 0x5625ffad1380;
  b.regs.si = 0x1000;
  b.regs.dx = 0x2000;
  char hello[16] = "hello-0";
  b.mem.map(0x1000, hello, 16);
  b.mem.map(0x2004, "recname", 8);
  std::string want =
      "       probetest-5681    [000] .....   452.727206: ref_big: (0x5625ffad1380) "
      "arr={0x68,0x65,0x6c,0x6c,0x6f,0x2d,0x30,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0,0x0} "
      "s=\"hello-0\" s2=\"hello-0\" c={'r','e','c','n','a','m','e','";
  want += '\0';
  want += "'}\n";
  EXPECT_EQ(line_for(big, b, 452727206000, nullptr, 0), want);

  CompiledEvent foff = compile_line("p:uprobes/ref_foff " + kProg +
                                    ":0x1370 by_vaddr=@+0x4038:s32 by_fileoff=@+0x3038:s32 "
                                    "abs=@0x4038:s32");
  Hit o;
  o.ctx.pid = 9230;
  o.ctx.ip = 0x56121200d370;
  int32_t v = 4660, garbage = 990059265;
  o.mem.map(0x56121200c000 + 0x4038, &v, 4);
  o.mem.map(0x56121200c000 + 0x3038, &garbage, 4);
  EXPECT_EQ(line_for(foff, o, 1257562019000),
            "       probetest-9230    [001] .....  1257.562019: ref_foff: (0x56121200d370) "
            "by_vaddr=4660 by_fileoff=990059265 abs=0\n");
}

// Kprobe-style lines: (sym+off/size) and (caller+off/size <- func); strings print.
class TableSymbolizer : public Symbolizer {
 public:
  bool lookup(uint64_t addr, SymbolInfo* out) override {
    struct Sym {
      const char* name;
      uint64_t start, size;
      const char* module;
    };
    static const Sym kSyms[] = {{"add3", 0x401370, 0x10, ""},
                                {"main", 0x401100, 0x90, ""},
                                {"malloc", 0x7f0000001000, 0x200, "libc.so.6"}};
    for (const Sym& s : kSyms) {
      if (addr >= s.start && addr < s.start + s.size) {
        out->name = s.name;
        out->offset = addr - s.start;
        out->size = s.size;
        out->module = s.module;
        return true;
      }
    }
    return false;
  }
};

TEST(TraceLine, KprobeStyle) {
  TableSymbolizer syms;
  Hit h;
  h.ctx.ip = 0x401370;
  h.regs.di = 7;
  h.regs.si = 0x1000;
  h.mem.map_string(0x1000, "hi there");
  CompiledEvent p = compile_line("p:kprobes/add3 add3 a=$arg1:s32 s=+0($arg2):string "
                                 "imm=\\\"lit\" fn=%ip:symbol");
  h.regs.ip = 0x401375;
  EXPECT_EQ(line_for(p, h, 1000001000, &syms),
            "       probetest-5455    [001] .....     1.000001: add3: (add3+0x0/0x10) a=7 "
            "s=\"hi there\" imm=\"lit\" fn=add3+0x5/0x10\n");
  CompiledEvent r = compile_line("r:kprobes/add3_ret add3 rv=$retval:s32 a=$arg1");
  uint64_t entry[1] = {7};
  h.ctx.entry_args = entry;
  h.ctx.ret_ip = 0x401150;
  h.regs.ax = static_cast<uint64_t>(-3);
  h.regs.di = 99;  // clobbered by the time of the return: $arg1 comes from the entry
  EXPECT_EQ(line_for(r, h, 2000000000, &syms),
            "       probetest-5455    [001] .....     2.000000: add3_ret: (main+0x50/0x90 <- "
            "add3) rv=-3 a=0x7\n");
  CompiledEvent lib = compile_line("p:kprobes/m libc:malloc");
  h.ctx.ip = 0x7f0000001000;
  EXPECT_EQ(line_for(lib, h, 3000000000, &syms),
            "       probetest-5455    [001] .....     3.000000: m: "
            "(malloc+0x0/0x200 [libc.so.6])\n");
  // Unknown addresses print as hexadecimal.
  h.ctx.ip = 0x1234;
  EXPECT_EQ(line_for(lib, h, 3000000000, &syms),
            "       probetest-5455    [001] .....     3.000000: m: (0x1234)\n");
}

TEST(TraceLine, DataSymbolsResolveAtCompile) {
  ParseResult r = parse_kprobe_command("p:g/e main x=@g_counter:s32 y=+0(@g_table+8):string");
  ASSERT_EQ(r.status, ParseStatus::kDefine);
  CompiledEvent ev;
  Diagnostic err;
  auto resolve = [](std::string_view s, uint64_t* a) {
    if (s == "g_counter") *a = 0x5000;
    else if (s == "g_table") *a = 0x6000;
    else return false;
    return true;
  };
  ASSERT_TRUE(compile(r.def, resolve, &ev, &err));
  Hit h;
  h.ctx.ip = 0x401100;
  int32_t c = -2;
  h.mem.map(0x5000, &c, 4);
  uint64_t p = 0x7000;
  h.mem.map(0x6008, &p, 8);
  h.mem.map_string(0x7000, "tbl");
  EXPECT_EQ(line_for(ev, h, 0),
            "       probetest-5455    [001] .....     0.000000: e: (0x401100) x=-2 y=\"tbl\"\n");
  ParseResult bad = parse_kprobe_command("p:g/e main x=@nope");
  EXPECT_FALSE(compile(bad.def, resolve, &ev, &err));
  EXPECT_EQ(err.err, ENOENT);
  EXPECT_EQ(err.message(), "Invalid probed address or symbol");
}

TEST(TraceLine, StringArraysAndBitfields) {
  CompiledEvent ev = compile_line("p:g/e main v=+0(%di):string[2] b=%si:b3@1/64 "
                                  "w=+0(%dx):b2@1/8[2]");
  Hit h;
  h.ctx.ip = 0x401100;
  uint64_t ptrs[2] = {0x1000, 0x2000};
  h.mem.map(0x3000, ptrs, sizeof ptrs);
  h.mem.map_string(0x1000, "one");
  h.mem.map_string(0x2000, "two");
  h.regs.di = 0x3000;
  h.regs.si = 0xe;  // bits 1..3 = 7
  uint8_t w[2] = {0x6, 0x2};
  h.mem.map(0x4000, w, 2);
  h.regs.dx = 0x4000;
  EXPECT_EQ(line_for(ev, h, 0),
            "       probetest-5455    [001] .....     0.000000: e: (0x401100) "
            "v={\"one\",\"two\"} b=7 w={3,1}\n");
}

TEST(TraceLine, HeaderAndLost) {
  EXPECT_EQ(trace_header(21, 21, 2),
            "# tracer: nop\n"
            "#\n"
            "# entries-in-buffer/entries-written: 21/21   #P:2\n"
            "#\n"
            "#                                _-----=> irqs-off/BH-disabled\n"
            "#                               / _----=> need-resched\n"
            "#                              | / _---=> hardirq/softirq\n"
            "#                              || / _--=> preempt-depth\n"
            "#                              ||| / _-=> migrate-disable\n"
            "#                              |||| /     delay\n"
            "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
            "#              | |         |   |||||     |         |\n");
  std::string s;
  format_lost_events(s, 0, 531);
  EXPECT_EQ(s, "CPU:0 [LOST 531 EVENTS]\n");
  // 03-uprobe-profile.txt
  s.clear();
  format_profile_line(s, "/tmp/ex/t", "work", 1400000);
  format_profile_line(s, "/srv/reference/kernel-tracefs-caps/prog/probetest",
                      "a_very_long_event_name_that_is_longer_than_44_characters_x", 0);
  EXPECT_EQ(s,
            "  /tmp/ex/t work                                                 1400000\n"
            "  /srv/reference/kernel-tracefs-caps/prog/probetest "
            "a_very_long_event_name_that_is_longer_than_44_characters_x               0\n");
}

TEST(TraceLine, UnknownCommAndTruncatedRecords) {
  CompiledEvent ev = compile_line("p:uprobes/ref_negs " + kProg + ":0x13c0 s=+0(%di):string");
  Hit h;
  h.ctx.ip = 0x560207993370;
  h.ctx.pid = 6890;
  h.regs.di = 0x1000;
  h.mem.map_string(0x1000, "abc");
  uint8_t rec[256];
  uint32_t n = write_record(view_of(ev.program), h.ctx, h.mem, rec, sizeof rec);
  std::string out;
  LineContext lc{"<...>", 6890, 1, 635322451000};
  ASSERT_TRUE(format_trace_line(out, ev, lc, rec, n));
  EXPECT_EQ(out,
            "           <...>-6890    [001] .....   635.322451: ref_negs: (0x560207993370) "
            "s=\"abc\"\n");
  // A record whose string points outside it prints a fault instead of reading past it.
  out.clear();
  ASSERT_TRUE(format_trace_line(out, ev, lc, rec, n - 2));
  EXPECT_NE(out.find("s=(fault)"), std::string::npos);
  EXPECT_FALSE(format_trace_line(out, ev, lc, rec, 10));
  // No room for the string in the buffer: a fault, not an overflow.
  EXPECT_EQ(write_record(view_of(ev.program), h.ctx, h.mem, rec, ev.program.fixed_size),
            ev.program.fixed_size);
}

// The live reader, on real memory: good reads, a NULL pointer, an unmapped page, and a
// string that runs into an unreadable page.
TEST(LiveMemoryReader, NeverCrashes) {
  LiveMemoryReader rd = LiveMemoryReader::for_self();
  uint64_t v = 0x1122334455667788, got = 0;
  EXPECT_TRUE(rd.read(reinterpret_cast<uint64_t>(&v), &got, 8));
  EXPECT_EQ(got, v);
  EXPECT_FALSE(rd.read(0, &got, 8));
  EXPECT_FALSE(rd.read(1, &got, 8));
  EXPECT_FALSE(rd.read(~0ull - 3, &got, 8));
  long page = sysconf(_SC_PAGESIZE);
  auto* map = static_cast<char*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(map + page, page, PROT_NONE), 0);
  char buf[64];
  // Ends exactly at the page's last byte.
  std::memcpy(map + page - 4, "abc", 4);
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map + page - 4), buf, sizeof buf), 4);
  EXPECT_STREQ(buf, "abc");
  // Runs into the unreadable page: a fault.
  std::memcpy(map + page - 3, "xyz", 3);
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map + page - 3), buf, sizeof buf), -1);
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map + page), buf, sizeof buf), -1);
  EXPECT_FALSE(rd.read(reinterpret_cast<uint64_t>(map + page - 4), &got, 8));
  // A long string is cut to the room given, still terminated.
  std::memset(map, 'q', 200);
  map[200] = 0;
  EXPECT_EQ(rd.read_string(reinterpret_cast<uint64_t>(map), buf, sizeof buf), 64);
  EXPECT_EQ(std::strlen(buf), 63u);
  // errno is not touched by the raw system call.
  errno = 1234;
  rd.read(0, &got, 8);
  EXPECT_EQ(errno, 1234);
  munmap(map, 2 * page);

  // The whole path: a record from live memory with bad pointers in it.
  CompiledEvent ev = compile_line("p:uprobes/x " + kProg +
                                  ":0x1370 s=+0(%di):string n=+8(%si):u64 ok=+0(%dx):string");
  PtRegs regs{};
  regs.di = 8;
  regs.si = 0xdead0000;
  const char* hello = "live";
  regs.dx = reinterpret_cast<uint64_t>(hello);  // +0(%dx):string reads at dx
  HitContext ctx;
  ctx.regs = &regs;
  ctx.ip = 0x1370;
  uint8_t rec[512];
  uint32_t n = write_record(view_of(ev.program), ctx, rd, rec, sizeof rec);
  std::string out;
  ASSERT_TRUE(format_trace_line(out, ev, LineContext{"t", 1, 0, 0}, rec, n));
  EXPECT_NE(out.find("s=(fault) n=0 ok=\"live\""), std::string::npos) << out;
}

}  // namespace
}  // namespace probefs::events
