// Invalid draws of the fuzzing harness (fuzz_draws.h): a valid call of one entry point on poisoned
// memory, corrupted in one way, must be refused by fmha::check and fmha::run with a message naming
// the argument, without a byte of memory changing.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <iostream>
#include <string>
#include <vector>

#include "fuzz_corruptions.h"

namespace fmha_fuzz {
namespace {

// True when `message` names `name` as a word: not inside a longer identifier ("q" is not named by
// "Lq" or "cu_seqlens_q"; "dout" not by "douts").
bool names_argument(const std::string& message, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t at = message.find(name); at != std::string::npos;
       at = message.find(name, at + 1)) {
    const bool starts = at == 0 || !(word(message[at - 1]) || message[at - 1] == '.');
    const std::size_t end = at + name.size();
    const bool ends = end >= message.size() || !word(message[end]);
    if (starts && ends) return true;
  }
  return false;
}

// Every argument name a message about this call may use.
std::vector<std::string> all_names(const Call& call) {
  std::vector<std::string> names = call.scalar_names;
  for (const Slot& s : call.slots) names.push_back(s.name);
  return names;
}

// Poisons the used part of the block, writes the varlen offsets, and returns its bytes.
std::vector<unsigned char> prepare_memory(Arena& arena, const Call& call) {
  Memory& m = arena.memory();
  m.fill(m.base(), 0xA5, arena.used());
  if (call.offsets_q_at)
    m.write(call.offsets_q_at, call.offsets_q.data(), call.offsets_q.size() * sizeof(std::int32_t));
  if (call.offsets_k_at)
    m.write(call.offsets_k_at, call.offsets_k.data(), call.offsets_k.size() * sizeof(std::int32_t));
  std::vector<unsigned char> bytes(arena.used());
  m.read(bytes.data(), m.base(), bytes.size());
  return bytes;
}

bool memory_unchanged(Arena& arena, const std::vector<unsigned char>& before,
                      std::size_t* first_changed) {
  std::vector<unsigned char> after(before.size());
  arena.memory().read(after.data(), arena.memory().base(), after.size());
  if (after == before) return true;
  *first_changed = static_cast<std::size_t>(
      std::mismatch(after.begin(), after.end(), before.begin()).first - after.begin());
  return false;
}

std::string status_string(const Status& s) {
  static constexpr const char* kCodes[] = {"ok", "invalid_argument", "not_supported",
                                           "backend_error"};
  return std::string(kCodes[static_cast<int>(s.code())]) +
         (s.message().empty() ? "" : " \"" + s.message() + "\"");
}

}  // namespace

void fuzz_invalid(Memory& memory, const FuzzRun& run) {
  Arena arena(memory);
  CrashNote crash_note;
  std::int64_t failures = 0;
  std::array<std::int64_t, kEntries> per_entry{};
  std::array<std::int64_t, kKinds> per_kind{};
  for (std::int64_t i = 0; i < run.count && failures < run.max_failures; ++i) {
    const std::uint64_t seed = run.seed + static_cast<std::uint64_t>(i);
    const std::string replay = run.replay_prefix + std::to_string(seed) + " " + run.replay_suffix;
    crash_note.set("invalid draw seed " + std::to_string(seed) + "; replay: " + replay);
    Dice dice(seed);
    arena.reset();
    Call call;
    // The corruption first, then an entry point it applies to: every kind gets its share.
    Kind kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    while (!fits(kind, memory.device())) kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    std::vector<Entry> entries;
    for (int e = 0; e < kEntries; ++e)
      if (fits(kind, static_cast<Entry>(e))) entries.push_back(static_cast<Entry>(e));
    const Entry entry = entries[static_cast<std::size_t>(
        dice.uniform(0, static_cast<std::int64_t>(entries.size()) - 1))];
    call.force_bias_gradient = kind == Kind::kBroadcastGradient || kind == Kind::kOrphanGradient;
    build(call, entry, dice, arena, memory.device());
    const std::string base = describe(call);
    auto fail = [&](const std::string& what) {
      ++failures;
      ADD_FAILURE() << "invalid draw seed " << seed << ": " << what << "\n  draw: " << base
                    << "\n  replay: " << replay;
    };
    if (arena.overflowed()) {
      fail("the draw does not fit the harness's memory block (" +
           std::to_string(memory.capacity()) + " bytes)");
      continue;
    }
    prepare_memory(arena, call);
    const Status valid = call.check();
    if (!valid.ok()) {
      fail("the valid call is refused: " + status_string(valid));
      continue;
    }
    Expected x;
    // A kind that does not fit this draw after all (e.g. no dimension of size > 1): another one.
    for (int attempt = 0; attempt < 100 && !corrupt(kind, call, dice, arena, &x); ++attempt) {
      x = {};
      kind = static_cast<Kind>(dice.uniform(0, kKinds - 1));
    }
    if (arena.overflowed()) {
      fail("the corruption does not fit the harness's memory block");
      continue;
    }
    ++per_entry[static_cast<std::size_t>(entry)];
    ++per_kind[static_cast<std::size_t>(kind)];
    const std::string corrupted = std::string(kind_name(kind)) + ": " + x.what;
    if (run.verbose)
      std::cout << "invalid draw seed " << seed << ": " << base << "\n  corrupted " << corrupted
                << std::endl;
    const std::vector<unsigned char> before = prepare_memory(arena, call);
    const Status checked = call.check();
    std::size_t changed = 0;
    if (!memory_unchanged(arena, before, &changed)) {
      fail("check() wrote memory (byte " + std::to_string(changed) + ") after " + corrupted);
      continue;
    }
    if (checked.ok()) {
      fail("accepted by check() after " + corrupted);
      continue;
    }
    std::vector<std::string> problems;
    if (checked.code() != x.code)
      problems.push_back("status " + status_string(checked) + ", expected code " +
                         std::to_string(static_cast<int>(x.code)));
    if (checked.message().rfind("fmha: ", 0) != 0)
      problems.push_back("the message does not start with \"fmha: \"");
    bool named = false;
    for (const std::string& n : x.names) named = named || names_argument(checked.message(), n);
    if (!named && x.any_name)
      for (const std::string& n : all_names(call))
        named = named || names_argument(checked.message(), n);
    if (!named) {
      std::string expected;
      for (const std::string& n : x.names) expected += (expected.empty() ? "" : ", ") + n;
      problems.push_back("the message names none of: " + expected +
                         (x.any_name ? " (or any argument)" : ""));
    }
    const Status ran = call.run();
    if (ran.code() != checked.code() || ran.message() != checked.message())
      problems.push_back("run() returned " + status_string(ran) + " but check() " +
                         status_string(checked));
    if (!memory_unchanged(arena, before, &changed))
      problems.push_back("run() wrote memory (byte " + std::to_string(changed) +
                         ") although it refused the call");
    if (!problems.empty()) {
      std::string text = corrupted + "\n  message: " + checked.message();
      for (const std::string& p : problems) text += "\n  problem: " + p;
      fail(text);
    }
  }
  std::cout << "[ fuzz ] invalid draws from seed " << run.seed << ":";
  std::int64_t total = 0;
  for (int e = 0; e < kEntries; ++e) {
    std::cout << ' ' << entry_name(static_cast<Entry>(e)) << '='
              << per_entry[static_cast<std::size_t>(e)];
    total += per_entry[static_cast<std::size_t>(e)];
  }
  std::cout << " (" << total << " in all)\n[ fuzz ] corruptions:";
  for (int k = 0; k < kKinds; ++k)
    std::cout << ' ' << kind_name(static_cast<Kind>(k)) << '='
              << per_kind[static_cast<std::size_t>(k)];
  std::cout << std::endl;
}

}  // namespace fmha_fuzz
