//! The harness itself: the cluster a test gets is what it claims to be.

use crate::harness::CitusDatabase;

#[tokio::test]
async fn the_cluster_has_a_coordinator_and_two_workers_with_metadata() {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let rows = db
        .connect()
        .await
        .query(
            "SELECT groupid, nodeport, hasmetadata, shouldhaveshards FROM pg_dist_node \
             WHERE isactive AND noderole = 'primary' ORDER BY groupid",
            &[],
        )
        .await
        .expect("read pg_dist_node");
    let nodes: Vec<(i32, i32, bool, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let [coordinator, w1, w2] = db.cluster.ports.map(i32::from);
    assert_eq!(
        nodes,
        vec![
            (0, coordinator, true, false),
            (1, w1, true, true),
            (2, w2, true, true),
        ]
    );
}
