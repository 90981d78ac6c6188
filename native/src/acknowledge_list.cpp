// One acknowledgement command for a list of messages: pulsar::Consumer::acknowledgeAsync
// of a std::vector<pulsar::MessageId>, which pulsar-client's C API does not offer.
//
// With acknowledgement grouping turned off, pulsar-client sends the ids of one such call to
// the broker in one CommandAck, and a consumer keeps no grouping timer (the timer is what an
// idle proxy with thousands of consumers spent its CPU on). The call is made through the
// address of the member function, which Python finds by its mangled name in the library
// pulsar-client loads (backend/consumer_ack.py); it is not linked against.
//
// The declarations below mirror pulsar-client's public headers (pulsar/MessageId.h,
// pulsar/Result.h, pulsar/Consumer.h): a MessageId is one shared_ptr to its implementation,
// and std::vector, std::function and std::shared_ptr have one layout in libstdc++, the C++
// library both sides load.

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace pulsar {
enum Result : int;
class MessageIdImpl;
class MessageId {
   public:
    MessageId(const MessageId&) = default;
    MessageId& operator=(const MessageId&) = default;
    ~MessageId() = default;

   private:
    std::shared_ptr<MessageIdImpl> impl_;
};
class Consumer;
}  // namespace pulsar

namespace {
// void pulsar::Consumer::acknowledgeAsync(const std::vector<MessageId>&,
//                                         const std::function<void(Result)>&): the Itanium
// C++ ABI passes `this` first and references as pointers.
using AcknowledgeList = void (*)(pulsar::Consumer*, const std::vector<pulsar::MessageId>*,
                                 const std::function<void(pulsar::Result)>*);
}  // namespace

// Acknowledge the `count` message ids at `ids` (each a live pulsar::MessageId, as the C
// API's pulsar_message_id_t holds one) on `consumer` (a live pulsar::Consumer, as the C
// API's pulsar_consumer_t holds one), through `function`. Returns how many; pulsar-client
// copies what it keeps.
extern "C" std::size_t starlight_acknowledge_list(void* function, void* consumer,
                                                  const void* const* ids, std::size_t count) {
    std::vector<pulsar::MessageId> list;
    list.reserve(count);
    for (std::size_t i = 0; i < count; i++) {
        list.push_back(*static_cast<const pulsar::MessageId*>(ids[i]));
    }
    // Nothing to do with the outcome: a consumer closed meanwhile gets its messages
    // redelivered by the broker (at least once).
    const std::function<void(pulsar::Result)> done = [](pulsar::Result) {};
    reinterpret_cast<AcknowledgeList>(function)(static_cast<pulsar::Consumer*>(consumer), &list,
                                                &done);
    return list.size();
}
