// The properties panel shows Periodic as one check box per axis (pqNeighborGridAxisFlagsWidget):
// each box sets its own element of the property, and a value set from a script shows in the
// boxes. ParaView's own widget for a 3-element boolean would set element 0 only. Runs the panel
// offscreen (QT_QPA_PLATFORM=offscreen) with the plugin loaded as the ParaView client loads it.
//
//   TestPeriodicCheckBoxes <NeighborGrid.so>
#include "pqInterfaceTracker.h"
#include "pqObjectBuilder.h"
#include "pqPVApplicationCore.h"
#include "pqPluginManager.h"
#include "pqPropertyWidget.h"
#include "pqProxyWidget.h"
#include "pqServerResource.h"
#include "pqStandardPropertyWidgetInterface.h"
#include "vtkSMPropertyHelper.h"
#include "vtkSMProxy.h"
#include "vtkSMProxyManager.h"
#include "vtkSMSessionProxyManager.h"
#include "vtkSmartPointer.h"

#include <QApplication>
#include <QCheckBox>

#include <iostream>
#include <string>

namespace
{

int failures = 0;

void Check(bool condition, const std::string& what)
{
  if (!condition)
  {
    std::cerr << "FAILED: " << what << std::endl;
    ++failures;
  }
}

std::string ValueOf(vtkSMProxy* proxy)
{
  vtkSMPropertyHelper periodic(proxy, "Periodic");
  return "[" + std::to_string(periodic.GetAsInt(0)) + ", " + std::to_string(periodic.GetAsInt(1)) + ", " +
    std::to_string(periodic.GetAsInt(2)) + "]";
}

pqPropertyWidget* WidgetOf(pqProxyWidget& panel, vtkSMProperty* property)
{
  for (pqPropertyWidget* widget : panel.findChildren<pqPropertyWidget*>())
  {
    if (widget->property() == property)
    {
      return widget;
    }
  }
  return nullptr;
}

} // namespace

int main(int argc, char* argv[])
{
  if (argc < 2)
  {
    std::cerr << "usage: TestPeriodicCheckBoxes <NeighborGrid.so>" << std::endl;
    return EXIT_FAILURE;
  }
  QApplication application(argc, argv);
  pqPVApplicationCore core(argc, argv);
  // The panel's standard widgets and decorators, as the ParaView client registers them.
  core.interfaceTracker()->addInterface(new pqStandardPropertyWidgetInterface(&core));
  pqServer* server = core.getObjectBuilder()->createServer(pqServerResource("builtin:"));
  QString error;
  if (core.getPluginManager()->loadExtension(server, argv[1], &error, false) != pqPluginManager::LOADED)
  {
    std::cerr << "FAILED: the plugin does not load: " << error.toStdString() << std::endl;
    return EXIT_FAILURE;
  }
  vtkSmartPointer<vtkSMProxy> proxy;
  proxy.TakeReference(
    vtkSMProxyManager::GetProxyManager()->GetActiveSessionProxyManager()->NewProxy("filters", "PointNeighborhood"));
  pqProxyWidget panel(proxy);
  panel.updatePanel();

  pqPropertyWidget* widget = WidgetOf(panel, proxy->GetProperty("Periodic"));
  Check(widget != nullptr, "no panel widget for Periodic");
  const QList<QCheckBox*> boxes = widget ? widget->findChildren<QCheckBox*>() : QList<QCheckBox*>();
  Check(boxes.size() == 3, "Periodic shows " + std::to_string(boxes.size()) + " check boxes, not 3");
  const char* const expected[3] = { "[1, 0, 0]", "[0, 1, 0]", "[0, 0, 1]" };
  for (int axis = 0; axis < 3 && boxes.size() == 3; ++axis)
  {
    const std::string name = boxes[axis]->text().toStdString();
    boxes[axis]->setChecked(true);
    panel.apply();
    Check(ValueOf(proxy) == expected[axis], "check box '" + name + "' sets Periodic to " + ValueOf(proxy));
    boxes[axis]->setChecked(false);
    panel.apply();
  }

  // As a script sets it: Periodic = [1, 0, 1].
  const int fromScript[3] = { 1, 0, 1 };
  vtkSMPropertyHelper(proxy, "Periodic").Set(fromScript, 3);
  proxy->UpdateVTKObjects();
  panel.reset();
  for (int axis = 0; axis < 3 && boxes.size() == 3; ++axis)
  {
    Check(boxes[axis]->isChecked() == (fromScript[axis] == 1),
      "after Periodic = [1, 0, 1] the check box '" + boxes[axis]->text().toStdString() + "' is " +
        (boxes[axis]->isChecked() ? "checked" : "unchecked"));
  }
  std::cout << "TestPeriodicCheckBoxes: " << (failures ? "FAILED" : "all checks passed") << std::endl;
  return failures ? EXIT_FAILURE : EXIT_SUCCESS;
}
