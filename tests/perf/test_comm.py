"""course.perf.comm: transports, adapters per node, the pipelined tree, the sharded parameter server.

Each test marked "old defect" fails on the model this one replaced (one efficiency for every link, one
adapter per node, the unpipelined tree, one unsharded server, 4-byte gradients in every precision).
"""

from dataclasses import replace

import pytest

from course.collectives import cost_model
from course.perf import catalog, microbench, workloads
from course.perf import model as pm
from course.perf.comm import Cluster, allreduce_seconds, alpha_beta, server_phase_seconds

pytestmark = pytest.mark.unit5

UBER_TCP = Cluster(catalog.gpu("P100 PCIe"), catalog.link("PCIe 3.0 x16"), 4, catalog.link("25GbE"), 1)
UBER_ROCE = replace(UBER_TCP, inter=catalog.link("25GbE").over("roce"))
DGX_A100 = Cluster(catalog.gpu("A100 SXM4"), catalog.link("NVSwitch (A100, NVLink 3)"), 8,
                   catalog.link("InfiniBand HDR"), 8)


def test_each_transport_has_its_own_fitted_efficiency_and_latency():
    # old defect: one link efficiency (0.7) and one α for NVLink, PCIe, InfiniBand and TCP alike
    tcp, ib = alpha_beta(catalog.link("100GbE")), alpha_beta(catalog.link("InfiniBand EDR"))
    assert tcp.bandwidth == pytest.approx(12.5e9 * microbench.constant("efficiency.tcp"))
    assert tcp.bandwidth < 0.65 * 12.5e9 < 0.95 * 12.5e9 < ib.bandwidth
    assert tcp.alpha_s > 5 * ib.alpha_s


def test_a_gradient_heavy_cnn_over_tcp_does_not_scale_for_free():
    # old defect: VGG-16 on 128 GPUs over 25 Gbit/s TCP was predicted at ~99% scaling efficiency
    vgg = workloads.vgg16()
    tcp = pm.scaling_curve(vgg, 64, (1, 128), UBER_TCP)[128]["efficiency"]
    roce = pm.scaling_curve(vgg, 64, (1, 128), UBER_ROCE)[128]["efficiency"]
    assert tcp < 0.9 and roce > tcp


def test_pipelined_tree_moves_about_what_the_ring_moves():
    # old defect: the only tree was the unpipelined binomial tree, 7-8x the ring at 256 GPUs
    _, ring = cost_model.coefficients("ring", 256)
    _, binomial = cost_model.coefficients("tree", 256)
    _, pipelined = cost_model.coefficients("pipelined_tree", 256)
    assert binomial / ring == pytest.approx(16 / (2 * 255 / 256))
    assert pipelined / ring == pytest.approx(2 / (2 * 255 / 256)) and pipelined / ring < 1.01
    big_node = replace(DGX_A100, gpus_per_node=256, inter=None)
    assert allreduce_seconds(1e9, 256, big_node, "pipelined_tree") < 1.1 * allreduce_seconds(1e9, 256, big_node, "ring")


def test_several_adapters_per_node_share_the_network():
    # old defect: one adapter per node, whatever the node had
    one_nic = replace(DGX_A100, nics_per_node=1)
    eight = allreduce_seconds(1e9, 32, DGX_A100, "hierarchical")
    assert eight < allreduce_seconds(1e9, 32, one_nic, "hierarchical") / 4
    assert DGX_A100.network_per_gpu().bandwidth == pytest.approx(alpha_beta(DGX_A100.inter).bandwidth)


def test_hierarchical_is_the_one_two_level_formula():
    inside, between = alpha_beta(DGX_A100.intra), DGX_A100.network_per_gpu()
    n = 1e9
    by_hand = (2 * 7 * inside.alpha_s + 2 * 7 / 8 * n * inside.beta_s_per_byte
               + 2 * 3 * between.alpha_s + 2 * 3 / 4 * n / 8 * between.beta_s_per_byte)
    assert allreduce_seconds(n, 32, DGX_A100, "hierarchical") == pytest.approx(by_hand)
    assert cost_model.predict_hierarchical(n, 8, 4, inside, between, within="ring") == pytest.approx(by_hand)


def test_sharded_parameter_server_closed_form():
    # old defect: one unsharded server was all it could express (~10x off at 128 GPUs)
    node = UBER_TCP.network_per_node()
    n = 178e6
    one = server_phase_seconds(n, 128, UBER_TCP, 1)
    assert one == pytest.approx(node.alpha_s + 124 * n * node.beta_s_per_byte)  # 124 remote workers into one node
    sharded = server_phase_seconds(n, 128, UBER_TCP, 32)
    assert sharded == pytest.approx(node.alpha_s + max(124 * n / 32, 4 * n * 31 / 32) * node.beta_s_per_byte)
    assert one > 25 * sharded
    with pytest.raises(ValueError, match="server shards"):
        server_phase_seconds(n, 128, UBER_TCP, 33)


def test_an_allreduce_needs_a_known_algorithm():
    with pytest.raises(ValueError, match="algorithm"):
        allreduce_seconds(1e6, 8, DGX_A100, "butterfly")
    assert allreduce_seconds(1e6, 1, DGX_A100) == 0.0


def test_the_tree_across_nodes_pays_for_the_chain_inside_each_node():
    # NCCL's tree spans the nodes and chains each node's GPUs: 2·log2(nodes) + 2·(g-1) steps of latency
    cluster = Cluster(catalog.gpu("H100 SXM5"), catalog.link("NVSwitch (H100, NVLink 4)"), 8,
                      catalog.link("InfiniBand NDR"), 8)
    alpha = max(alpha_beta(cluster.intra).alpha_s, cluster.network_per_gpu().alpha_s)
    assert allreduce_seconds(0.0, 32, cluster, "pipelined_tree") == pytest.approx((2 * 2 + 2 * 7) * alpha)
    assert allreduce_seconds(0.0, 32, cluster, "pipelined_tree") > allreduce_seconds(0.0, 8, cluster, "pipelined_tree")
