// libFuzzer target for the agent link's decoder (events/link.h): arbitrary bytes as one
// packet. Whatever decodes must encode again, and encode to packets that decode to the
// same type, flags and seq; a REPLY goes through the assembler, and its packet, fed again
// as the continuation of a reply that never ends, is cut at kMaxReplySize.
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "events/link.h"

using namespace probefs::events::link;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Message m;
  std::string why;
  if (decode(data, size, &m, &why) != 0) {
    if (why.empty()) abort();  // every refusal says why
    return 0;
  }
  const auto packets = encode(m);
  if (packets.empty()) abort();
  ReplyAssembler as;
  for (const auto& p : packets) {
    if (p.size() > kMaxMessageSize) abort();
    Message again;
    if (decode(p.data(), p.size(), &again) != 0) abort();
    if (again.type != m.type || again.seq != m.seq ||
        (again.flags & ~kFlagMore) != (m.flags & ~kFlagMore))
      abort();
    if (again.type == MsgType::kReply && as.add(again) < 0) abort();
  }
  if (m.type == MsgType::kReply) {
    const Reply& r = std::get<Reply>(m.body);
    const size_t size = r.message.size() + 12 * r.profile.size();
    if (size >= 16 * 1024) {  // a bounded number of rounds per input
      m.flags |= kFlagMore;
      ReplyAssembler endless;
      size_t held = 0;
      int rc = 0;
      while ((rc = endless.add(m)) == 0) {
        held += size;
        if (held > kMaxReplySize) abort();
      }
      if (rc != -E2BIG) abort();
    }
  }
  return 0;
}
