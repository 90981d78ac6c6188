/*
 * Registers MessageBacklogServlet with the broker (additionalServlets=starlight-backlog).
 */
package io.starlight.broker;

import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.web.plugin.servlet.AdditionalServletWithPulsarService;
import org.apache.pulsar.common.configuration.PulsarConfiguration;
import org.eclipse.jetty.servlet.ServletHolder;

public class MessageBacklogPlugin implements AdditionalServletWithPulsarService {
    /** Where the broker serves it: http://broker:webServicePort/starlight/backlog?topic=... */
    public static final String BASE_PATH = "/starlight";

    private PulsarService pulsar;

    @Override
    public void setPulsarService(PulsarService pulsar) {
        this.pulsar = pulsar;
    }

    @Override
    public void loadConfig(PulsarConfiguration configuration) {
    }

    @Override
    public String getBasePath() {
        return BASE_PATH;
    }

    @Override
    public ServletHolder getServletHolder() {
        return new ServletHolder(new MessageBacklogServlet(pulsar));
    }

    @Override
    public void close() {
    }
}
