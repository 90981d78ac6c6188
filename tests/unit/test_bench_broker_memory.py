"""The delayed bench's reading of a broker's Prometheus page (bench/broker_memory.py)."""

from __future__ import annotations

import pytest

from starlight_py.bench.broker_memory import MIB, BrokerMemory, Peaks, parse

PAGE = """\
# TYPE jvm_memory_bytes_used gauge
jvm_memory_bytes_used{cluster="standalone",area="heap"} 2.097152E8
jvm_memory_bytes_used{cluster="standalone",area="nonheap"} 9.1E7
# TYPE jvm_memory_pool_bytes_used gauge
jvm_memory_pool_bytes_used{cluster="standalone",pool="G1 Eden Space"} 4.2E7
jvm_memory_pool_bytes_used{cluster="standalone",pool="G1 Old Gen"} 6.291456E7
# TYPE pulsar_delayed_message_index_size_bytes gauge
pulsar_delayed_message_index_size_bytes{cluster="standalone",topic="persistent://p/d/a"} 1048576
pulsar_delayed_message_index_size_bytes{cluster="standalone",topic="persistent://p/d/b"} 1048576
# TYPE pulsar_delayed_message_index_loaded gauge
pulsar_delayed_message_index_loaded{cluster="standalone",topic="persistent://p/d/a"} 5000
pulsar_delayed_message_index_loaded{topic="persistent://p/d/a",subscription="s"} 5000
# TYPE pulsar_delayed_message_index_bucket_total gauge
pulsar_delayed_message_index_bucket_total{cluster="standalone",topic="persistent://p/d/a"} 3
pulsar_delayed_message_index_bucket_total{topic="persistent://p/d/a",subscription="s"} 3
# TYPE pulsar_subscription_delayed gauge
pulsar_subscription_delayed{topic="persistent://p/d/a",subscription="s"} 123
"""


def test_the_heap_the_old_generation_and_the_delayed_index_summed_over_topics() -> None:
    memory = parse(PAGE)
    assert memory == BrokerMemory(
        heap_used=200 * MIB,
        old_generation=60 * MIB,
        delayed_index_bytes=2 * MIB,
        delayed_index_loaded=5000,  # the per-subscription repeat is not added
        delayed_buckets=3,
    )
    assert memory.describe() == (
        "heap used 200.0 MiB, old generation 60.0 MiB, delayed index 2.0 MiB, "
        "indexes in memory 5,000, buckets 3"
    )


def test_a_page_without_the_figures_says_so() -> None:
    memory = parse("# TYPE other gauge\nother 1\n")
    assert memory == BrokerMemory()
    assert memory.describe() == "no memory figures on the broker's page"


def test_a_malformed_page_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse("jvm_memory_bytes_used{area=heap} one\n")


def test_peaks_keep_the_largest_value_of_each_figure() -> None:
    peaks = Peaks()
    peaks.add(BrokerMemory(heap_used=3 * MIB, delayed_index_loaded=10))
    peaks.add(BrokerMemory(heap_used=2 * MIB, old_generation=MIB, delayed_index_loaded=20))
    assert peaks.samples == 2
    assert peaks.describe() == ("heap used 3.0 MiB, old generation 1.0 MiB, indexes in memory 20")
